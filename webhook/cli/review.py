"""``review`` and ``lint``: a policy tried on manifests offline, and policy files checked."""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import orjson
import yaml

from webhook.cli.common import EXIT_DENIED, EXIT_OK, Commands, UsageError
from webhook.core.cluster import view_from_objects
from webhook.core.policy import Policy, PolicyError, describe_yaml_error
from webhook.core.review import ReviewEntry, review_object
from webhook.install.manifests import BASE_NAMESPACE
from webhook.policies import load_policy
from webhook.render.admission import SYSTEM_NAMESPACES


def _read_text(path: str, stdin: TextIO) -> str:
    if path == "-":
        return stdin.read()
    try:
        return Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read: {exc}") from None


MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


def manifest_files(path: str) -> list[str]:
    """``path`` itself, or for a directory the manifests in it and below, sorted by path."""
    if path == "-" or not Path(path).is_dir():
        return [path]
    found = sorted(
        p for p in Path(path).rglob("*") if p.suffix in MANIFEST_SUFFIXES and p.is_file()
    )
    if not found:
        raise UsageError(f"{path}: a directory with no .yaml, .yml or .json files in it or below")
    return [str(p) for p in found]


def read_manifests(paths: Sequence[str], stdin: TextIO) -> Iterator[dict[str, Any]]:
    """Every object of every (multi-document YAML or JSON) file; directories are read
    recursively (see :func:`manifest_files`); ``List`` kinds expanded."""
    for path in (file for given in paths for file in manifest_files(given)):
        text = _read_text(path, stdin)
        try:
            documents = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            reason = describe_yaml_error(exc, text=text, what="not valid YAML or JSON")
            raise UsageError(f"{path}: {reason}") from None
        for number, document in enumerate(documents, 1):
            if document is None:
                continue
            if not isinstance(document, dict) or not isinstance(document.get("kind"), str):
                raise UsageError(f"{path}: document {number} is not a Kubernetes object (no kind)")
            if document["kind"].endswith("List") and isinstance(document.get("items"), list):
                for item in document["items"]:
                    if isinstance(item, dict) and isinstance(item.get("kind"), str):
                        yield item
                    else:
                        raise UsageError(f"{path}: document {number} has an item with no kind")
                continue
            yield document


def _text_report(entries: Sequence[ReviewEntry]) -> str:
    lines = []
    for entry in entries:
        verdict = "ALLOWED" if entry["allowed"] else "DENIED"
        where = f"{entry['namespace']}/{entry['name']}" if entry["namespace"] else entry["name"]
        lines.append(
            f"{entry['kind']} {where}: {verdict}  mode={entry['mode']}  "
            f"patch={len(entry['patch'])} ops"
        )
        for violation in entry["violations"]:
            lines.append(f"  {violation['action']:<5} {violation['rule']}: {violation['message']}")
        for excepted in entry.get("excepted", []):
            lines.append(
                f"  except {excepted['rule']}: {excepted['message']} "
                f"(exception {excepted['exception']})"
            )
        for warning in entry["warnings"]:
            if not any(warning.endswith(v["message"]) for v in entry["violations"]):
                lines.append(f"  note  {warning}")
        for op in entry["patch"]:
            value = orjson.dumps(op.get("value")).decode() if "value" in op else ""
            lines.append(f"  patch {op['op']} {op['path']} {value}".rstrip())
    return "\n".join(lines) + "\n"


def command_review(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    policy = load_policy(args.policy)
    # A snapshot of the cluster, read as the service's watch would see it.
    cluster = (
        view_from_objects(read_manifests([args.cluster], stdin), secrets=policy.secret_env)
        if args.cluster
        else None
    )
    objects = list(read_manifests(args.file, stdin))
    today = args.today or _today()
    entries = [
        review_object(
            obj,
            policy,
            namespace=args.namespace,
            username=args.user or "",
            groups=args.group or (),
            operation=args.operation,
            cluster=cluster,
            today=today,
        )
        for obj in objects
    ]
    _note_expired(policy, today)
    _note_excluded(objects, args.namespace, args.install_namespace)
    if args.output == "json":
        stdout.write(orjson.dumps(entries, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif args.output == "yaml":
        stdout.write(yaml.safe_dump(orjson.loads(orjson.dumps(entries)), sort_keys=False))
    else:
        stdout.write(_text_report(entries))
    return EXIT_OK if all(e["allowed"] for e in entries) else EXIT_DENIED


def excluded_namespaces(install_namespace: str) -> tuple[str, ...]:
    """The namespaces the install keeps out of admission: the webhooks' namespaceSelector
    and the CEL policies' exclude them (kube-system, and the install's own)."""
    system = [ns for ns in SYSTEM_NAMESPACES if ns != BASE_NAMESPACE]
    return (*system, install_namespace)


def _note_excluded(
    objects: Sequence[dict[str, Any]], namespace: str | None, install_namespace: str
) -> None:
    """One line on stderr per excluded namespace reviewed in: the verdicts printed are
    what the policy decides, but the apiserver never asks it there. stdout (the JSON
    contract) is unchanged."""
    excluded = excluded_namespaces(install_namespace)
    seen: set[str] = set()
    for obj in objects:
        where = namespace or str((obj.get("metadata") or {}).get("namespace") or "")
        if where in excluded and where not in seen:
            seen.add(where)
            sys.stderr.write(
                f"note: the install excludes namespace {where} (the webhooks' "
                "namespaceSelector and the CEL policies skip it): objects there are admitted "
                "without these checks; the verdicts are what the policy would decide elsewhere\n"
            )


def _today() -> str:
    return datetime.datetime.now(datetime.UTC).date().isoformat()


def expired_exceptions(policy: Policy, today: str) -> list[str]:
    """One line per exception of ``policy`` past its last day on ``today``."""
    return [
        f"exception {e.name} (owner {e.owner}) expired on {e.expires}: it no longer applies; "
        "remove it or give it a later expires"
        for e in policy.exceptions
        if e.expired(today)
    ]


def _note_expired(policy: Policy, today: str) -> None:
    for line in expired_exceptions(policy, today):
        sys.stderr.write(f"note: {line}\n")


def command_lint(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    status = EXIT_OK
    today = args.today or _today()
    for path in args.files:
        try:
            policy = load_policy(path)
        except PolicyError as exc:
            status = EXIT_DENIED
            for error in exc.errors:
                sys.stderr.write(f"{path}: {error}\n")
            continue
        stdout.write(f"{path}: ok (policy {policy.name}, hash {policy.digest})\n")
        for line in expired_exceptions(policy, today):
            stdout.write(f"{path}: warning: {line}\n")
    return status


def _day(text: str) -> str:
    try:
        return datetime.date.fromisoformat(text).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is no date (YYYY-MM-DD)") from None


def register(commands: Commands) -> None:
    review = commands.add_parser(
        "review", help="run manifests through mutation and validation offline"
    )
    review.add_argument(
        "-f",
        "--file",
        action="append",
        required=True,
        help="YAML/JSON file, a directory (its .yaml, .yml and .json files, recursively) "
        "or - for stdin",
    )
    review.add_argument("--policy", help="policy file (default: the bundled default policy)")
    review.add_argument("-o", "--output", choices=["json", "yaml", "text"], default="text")
    review.add_argument("--namespace", help="namespace to review in (default: the object's)")
    review.add_argument(
        "--install-namespace",
        default=BASE_NAMESPACE,
        metavar="NS",
        help=f"namespace the webhook is installed in, which the install excludes like "
        f"kube-system (default: {BASE_NAMESPACE})",
    )
    review.add_argument("--user", help="requesting user, to test exemptions")
    review.add_argument("--group", action="append", help="requesting user's group (repeatable)")
    review.add_argument(
        "--operation", choices=["CREATE", "UPDATE"], default="CREATE", help="admission operation"
    )
    review.add_argument(
        "--cluster",
        metavar="SNAPSHOT",
        help="YAML of Nodes, Namespaces, ConfigMaps, ResourceQuotas (and Secrets): judge as "
        "serve --cluster would in that cluster",
    )
    review.add_argument(
        "--today",
        type=_day,
        metavar="YYYY-MM-DD",
        help="the day exceptions' expiry is read against (default: today, UTC)",
    )
    review.set_defaults(handler=command_review)

    lint = commands.add_parser("lint", help="validate policy files")
    lint.add_argument("files", nargs="+", metavar="FILE")
    lint.add_argument(
        "--today",
        type=_day,
        metavar="YYYY-MM-DD",
        help="the day exceptions' expiry is read against (default: today, UTC)",
    )
    lint.set_defaults(handler=command_lint)
