"""The compiled core answers as the source does.

The image installs the wheel with ``webhook.core`` compiled by mypyc (pyproject's
mypyc build hook); development, ``make run`` and the rest of this suite run the
source. Compiled code checks its type annotations at run time and may differ where
Python is lenient, so generated reviews (well formed, attacked and junk) go to both:
the source in this process, the unpacked wheel (hack/build-native, or
$GPUSHARE_NATIVE) in a worker process. Every answer, patch, warning, audit
annotation and violation must be equal. Without a C compiler the test is skipped
locally and fails in CI (CI set), as the control plane's tests do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Final

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.fixtures import gpu_pod_5k, gpu_pod_20k, plain_pod_2k
from tests.core.native_worker import outcome
from tests.core.strategies import attacked_pods, corrupted, objects, wild_objects
from tests.paths import ROOT
from webhook.core.wire import Endpoint
from webhook.dev.testing import admission_review
from webhook.policies import parse_policy

WORKER: Final = Path(__file__).with_name("native_worker.py")
POLICY_TEXTS: Final = {
    path.stem: path.read_text("utf-8")
    for path in [
        ROOT / "policies" / "default.yaml",
        *sorted((ROOT / "policies" / "examples").glob("*.yaml")),
    ]
}
POLICIES: Final = {name: parse_policy(text) for name, text in POLICY_TEXTS.items()}


def _site() -> Path:
    if explicit := os.environ.get("GPUSHARE_NATIVE"):
        return Path(explicit)
    built = subprocess.run(
        [str(ROOT / "hack" / "build-native")],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    lines = built.stdout.strip().splitlines()
    if built.returncode == 0 and lines:
        return Path(lines[-1])
    reason = f"cannot build the compiled core: hack/build-native: {built.stderr[-2000:]}"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


class Worker:
    """The compiled core in a process of its own, asked one review at a time."""

    def __init__(self, site: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONHOME"}
        env["PYTHONPATH"] = str(site)
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.core = str(self._read()["core"])

    def _read(self) -> dict[str, Any]:
        stdout: IO[bytes] | None = self.process.stdout
        assert stdout is not None
        line = stdout.readline()
        assert line, f"the worker exited ({self.process.wait()})"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, policy: str, endpoint: Endpoint, review: Any) -> dict[str, Any]:
        stdin = self.process.stdin
        assert stdin is not None
        message = {"policy": POLICY_TEXTS[policy], "endpoint": endpoint, "review": review}
        # The stdlib's json: generated junk holds integers beyond 64 bits.
        stdin.write(json.dumps(message).encode() + b"\n")
        stdin.flush()
        return self._read()

    def close(self) -> None:
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def compiled() -> Iterator[Worker]:
    worker = Worker(_site())
    yield worker
    worker.close()


def test_the_worker_runs_the_compiled_core(compiled: Worker) -> None:
    # An extension module, not decision.py: otherwise the comparison proves nothing.
    assert compiled.core.endswith(".so"), compiled.core
    import webhook.core.decision

    assert webhook.core.decision.__file__ is not None
    assert webhook.core.decision.__file__.endswith(".py")


@pytest.mark.parametrize("endpoint", ["mutate", "validate"])
def test_the_benchmark_pods_answer_alike(compiled: Worker, endpoint: Endpoint) -> None:
    for pod in (gpu_pod_5k(), gpu_pod_20k(), plain_pod_2k()):
        review = admission_review(pod, namespace="ml")
        expected = json.loads(json.dumps(outcome(POLICIES["default"], endpoint, review)))
        assert "review" in expected  # answered, not refused as malformed
        assert compiled.ask("default", endpoint, review) == expected
    # The 5 KB GPU pod is mutated: the comparison covers a real patch.
    mutated = compiled.ask("default", "mutate", admission_review(gpu_pod_5k(), namespace="ml"))
    assert mutated["review"]["response"]["patch"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("oldObject", []), ("object", [1]), ("namespace", 7), ("operation", 3), ("resource", "x")],
)
def test_odd_wire_values_answer_alike(compiled: Worker, field: str, value: Any) -> None:
    # The wire's TypedDicts say what the apiserver sends; compiled code checked them on
    # read (a list as oldObject raised TypeError there, and the source answered).
    review: Any = admission_review(gpu_pod_5k(), namespace="ml")
    review["request"][field] = value
    for endpoint in ("mutate", "validate"):
        expected = json.loads(json.dumps(outcome(POLICIES["default"], endpoint, review)))
        assert compiled.ask("default", endpoint, review) == expected


def _review(kind: str, obj: Any, old: Any, operation: str) -> Any:
    review: Any = admission_review({}, kind=kind, operation=operation)
    review["request"]["object"] = obj
    review["request"]["oldObject"] = old if operation == "UPDATE" else None
    return review


reviews: Final = st.one_of(
    objects().map(lambda pair: (pair[0], pair[1], False)),
    wild_objects().map(lambda pair: (pair[0], pair[1], False)),
    attacked_pods().map(lambda pod: ("Pod", pod, False)),
    objects().map(lambda pair: (pair[0], pair[1], True)),
)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    subject=reviews,
    old=st.one_of(st.none(), objects().map(lambda pair: pair[1])),
    operation=st.sampled_from(["CREATE", "CREATE", "UPDATE"]),
    policy=st.sampled_from(sorted(POLICY_TEXTS)),
    endpoint=st.sampled_from(["mutate", "validate"]),
    data=st.data(),
)
def test_compiled_core_answers_as_the_source(
    compiled: Worker,
    subject: tuple[str, Any, bool],
    old: Any,
    operation: str,
    policy: str,
    endpoint: Endpoint,
    data: st.DataObject,
) -> None:
    kind, obj, mangle = subject
    review = _review(kind, obj, old, operation)
    if mangle:  # junk anywhere in the review itself, not only in the object
        review = data.draw(corrupted(review, odds=40))
    expected = json.loads(json.dumps(outcome(POLICIES[policy], endpoint, review)))
    assert compiled.ask(policy, endpoint, review) == expected
