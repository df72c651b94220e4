"""The must-admit corpus: real upstream GPU workloads under the default policy.

Each file under tests/corpus/<project>/ reproduces the admission-relevant shape of one
upstream manifest (its header names the repository, path and commit, the GPU stack it is
written for, and what the default policy must do with it). Custom resources are written as
the Pods their operator creates. A control that refuses real workloads gets uninstalled,
so every ``expect: admit`` file must be admitted; the ``expect: deny`` ones do what the
policy exists to stop, and none of them may be admitted. Admitted objects are also checked
against what their stack's node provides: no libvgpu where the stack has none, and a pod
that keeps its own scheduler for whole GPUs, or whose whole GPUs another stack serves, is
kept off the sharing pool. A file written for a stack the default policy does not run
(``nvidia.com/gpu`` served by DRA, which the default refuses as a DeviceClass) names the
example policy that declares it (``# policy: policies/examples/<name>.yaml``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from tests.paths import ROOT
from webhook.core.injection import VOLUME_LIBRARY
from webhook.core.policy import Policy
from webhook.core.resources import read_pod
from webhook.core.review import ReviewEntry, review_object
from webhook.core.whole import REQUIRED
from webhook.core.workload import find_pod
from webhook.policies import DEFAULT_POLICY, load_policy

CORPUS: Final = ROOT / "tests" / "corpus"
# The default policy's sharing pool (wholeGpus.sharingPool): HAMi's gpu=on nodes.
AWAY: Final = {"key": "gpu", "operator": "NotIn", "values": ["on"]}
_HEADER: Final = re.compile(r"^# (follows|stack|expect|why|operator|policy): (.+)$")
_FOLLOWS: Final = re.compile(
    r"^(?P<repo>[\w.-]+/[\w.-]+) (?P<path>\S+) @ (?P<commit>[0-9a-f]{40})$"
)
STACKS: Final = frozenset(
    {
        "hami",
        "hami-mig",
        "hami-mps",
        "ack",
        "ack-mps",
        "volcano",
        "kai",
        "kai-fraction",
        "nvidia",
        "mig",
        "dra",
        "none",
    }
)
# Stacks whose nodes have no HAMi-core: nothing may preload libvgpu there.
_NO_LIBVGPU: Final = frozenset(
    {"ack", "ack-mps", "kai", "kai-fraction", "mig", "dra", "none", "hami-mig"}
)

# Legitimate workloads the default policy still refuses, each with why: asserted refused
# (so an entry leaves this list the day its fix lands), never skipped.
STILL_REFUSED: Final[Mapping[str, str]] = {}
# Admitted, but mutated with what their stack's node does not provide.
STILL_WRONG: Final[Mapping[str, str]] = {}
# Stacks whose whole GPUs no sharing scheduler counts: a whole-GPU pod there keeps its
# scheduler, the cluster's own too, and is kept off the sharing pool.
_ELSEWHERE: Final = frozenset({"mig", "dra"})


@dataclass(frozen=True)
class Entry:
    path: Path
    repo: str
    stack: str
    expect: str
    denied_by: frozenset[str]
    objects: tuple[dict[str, Any], ...]
    # The default policy, or the example that declares a stack it does not run
    # (``# policy: policies/examples/<name>.yaml``).
    policy: Policy = DEFAULT_POLICY

    @property
    def name(self) -> str:
        return str(self.path.relative_to(CORPUS))


def _read(path: Path) -> Entry:
    text = path.read_text("utf-8")
    header: dict[str, str] = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        match = _HEADER.match(line)
        assert match, f"{path}: header line {line!r}"
        header[match[1]] = match[2].strip()
    follows = _FOLLOWS.match(header.get("follows", ""))
    assert follows, f"{path}: '# follows: <owner>/<repo> <path> @ <commit>' missing or malformed"
    assert header.get("stack") in STACKS, f"{path}: stack {header.get('stack')!r}"
    expect = header.get("expect", "")
    denied_by: frozenset[str] = frozenset()
    if expect.startswith("deny "):
        denied_by = frozenset(r.strip() for r in expect[5:].split(","))
        assert header.get("why"), f"{path}: a denied workload says why"
    else:
        assert expect == "admit", f"{path}: expect {expect!r}"
    objects = tuple(o for o in yaml.safe_load_all(text) if o)
    assert objects, f"{path}: no object"
    policy = DEFAULT_POLICY
    if "policy" in header:
        assert header["policy"].startswith("policies/examples/"), f"{path}: {header['policy']}"
        policy = load_policy(ROOT / header["policy"])
    stack = str(header["stack"])
    return Entry(path, follows["repo"], stack, expect, denied_by, objects, policy)


ENTRIES: Final = tuple(_read(p) for p in sorted(CORPUS.glob("*/*.yaml")))


def _ids() -> Iterator[str]:
    return (e.name for e in ENTRIES)


def reviewed(entry: Entry) -> list[ReviewEntry]:
    return [review_object(obj, entry.policy) for obj in entry.objects]


def test_the_corpus_follows_many_projects() -> None:
    assert len(ENTRIES) >= 100
    assert len({e.repo for e in ENTRIES}) >= 10, sorted({e.repo for e in ENTRIES})
    assert set(STILL_REFUSED) | set(STILL_WRONG) <= {e.name for e in ENTRIES}
    admitted = [e for e in ENTRIES if e.expect == "admit"]
    # The known gaps stay a small part of what real users run.
    assert len(STILL_REFUSED) * 10 <= len(admitted), len(STILL_REFUSED)


@pytest.mark.parametrize("entry", ENTRIES, ids=list(_ids()))
def test_each_workload_gets_its_verdict(entry: Entry) -> None:
    results = reviewed(entry)
    refused = [
        (r["kind"], r["name"], v["rule"], v["message"])
        for r in results
        for v in r["violations"]
        if v["action"] == "deny"
    ]
    if entry.denied_by:
        rules = {rule for _, _, rule, _ in refused}
        assert entry.denied_by <= rules, f"{entry.name}: refused by {sorted(rules)} only"
        return
    if entry.name in STILL_REFUSED:
        assert refused, f"{entry.name} is admitted now: take it off STILL_REFUSED"
        return
    assert not refused, f"{entry.name}: {refused}"


@pytest.mark.parametrize(
    "entry",
    [e for e in ENTRIES if e.expect == "admit"],
    ids=[e.name for e in ENTRIES if e.expect == "admit"],
)
def test_each_admitted_workload_runs_on_its_stack(entry: Entry) -> None:
    if entry.name in STILL_REFUSED:
        return
    problems: list[str] = []
    for obj, result in zip(entry.objects, reviewed(entry), strict=True):
        view = find_pod(result["object"], result["kind"])
        if view is None:
            continue
        spec = view.spec
        volumes = {v.get("name") for v in spec.get("volumes") or []}
        if entry.stack in _NO_LIBVGPU and VOLUME_LIBRARY in volumes:
            problems.append(f"{result['name']}: libvgpu injected on a {entry.stack} node")
        original = find_pod(obj, result["kind"])
        scheduler = original.spec.get("schedulerName") if original is not None else None
        # A scheduler the pod names is never replaced (only an empty or default one is).
        named = scheduler not in (None, "", "default-scheduler")
        if named and spec.get("schedulerName") != scheduler:
            problems.append(f"{result['name']}: schedulerName {scheduler} replaced")
        # Whole GPUs under a scheduler of the pod's own, or another stack's, stay off the
        # sharing pool.
        whole = result["mode"] == "none" and read_pod(spec, entry.policy).sharing
        kept = named and scheduler != entry.policy.scheduler_name
        if whole and (kept or entry.stack in _ELSEWHERE):
            required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(REQUIRED)
            terms = (required or {}).get("nodeSelectorTerms") or []
            if not terms or any(AWAY not in (t.get("matchExpressions") or []) for t in terms):
                problems.append(
                    f"{result['name']}: whole GPUs under {scheduler} not kept off the pool"
                )
        if entry.stack == "hami-mig" and spec.get("schedulerName") != "hami-scheduler":
            problems.append(f"{result['name']}: HAMi's dynamic MIG without hami-scheduler")
    if entry.name in STILL_WRONG:
        assert problems, f"{entry.name} runs on its stack now: take it off STILL_WRONG"
        return
    assert not problems, f"{entry.name}: {problems}"
