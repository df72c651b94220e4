"""What a newcomer meets first with ``review`` and ``lint``: directories, YAML mistakes,
error order, and objects whose kind the webhook does not inspect."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.cli.test_cli import run
from tests.paths import MANIFESTS

POD = """\
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: ml}}
spec:
  containers:
    - name: main
      image: cuda
      resources: {{limits: {{nvidia.com/gpumem: 1024}}}}
"""


def test_review_a_directory_reads_its_manifests_recursively_in_name_order(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text(POD.format(name="b"))
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "c.yml").write_text(POD.format(name="c"))
    (tmp_path / "a" / "d.json").write_text(
        json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "d"}})
    )
    (tmp_path / "a" / "notes.txt").write_text("not a manifest: [")
    (tmp_path / "README.md").write_text("# not a manifest: [")

    result = run("review", "-f", str(tmp_path), "-o", "json")

    assert result.returncode == 0, result.stderr
    assert [e["name"] for e in json.loads(result.stdout)] == ["c", "d", "b"]


def test_review_a_directory_and_a_file_keep_the_order_given(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "x.yaml").write_text(POD.format(name="x"))
    single = tmp_path / "single.yaml"
    single.write_text(POD.format(name="first"))

    result = run("review", "-f", str(single), "-f", str(tmp_path / "dir"), "-o", "json")

    assert result.returncode == 0, result.stderr
    assert [e["name"] for e in json.loads(result.stdout)] == ["first", "x"]


def test_review_a_directory_without_manifests_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("nothing here")

    result = run("review", "-f", str(tmp_path))

    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert str(tmp_path) in result.stderr
    assert ".yaml, .yml or .json" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a: b\n",
            "line 4, column 10: not valid YAML or JSON: mapping values are not allowed here",
        ),
        # Lines count from the file's start, whichever document the mistake is in.
        (
            POD.format(name="fine") + "---\nkind: Pod\nspec: [unclosed\n",
            "line 12, column 1: not valid YAML or JSON: expected ',' or ']', but got "
            "'<stream end>' (while parsing a flow sequence started at line 11)",
        ),
        # Refused by the reader, before parsing: placed all the same, on one line.
        (
            "kind: Pod\nmetadata:\n  name: a\x00b\n",
            "line 3, column 10: not valid YAML or JSON: "
            "character #x0000: special characters are not allowed",
        ),
    ],
)
def test_review_yaml_error_names_file_line_column_and_the_parsers_reason(
    tmp_path: Path, text: str, reason: str
) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(text)

    result = run("review", "-f", str(broken))

    assert result.returncode == 2
    assert result.stderr == f"gpushare-webhook: {broken}: {reason}\n"


def test_lint_yaml_error_names_line_column_and_the_parsers_reason(tmp_path: Path) -> None:
    broken = tmp_path / "policy.yaml"
    broken.write_text("apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n  a: b: c\n")

    result = run("lint", str(broken))

    assert result.returncode == 1
    assert result.stderr == (
        f"{broken}: line 4, column 7: not valid YAML: mapping values are not allowed here\n"
    )


def test_lint_errors_are_listed_in_line_order(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "spec:\n"  # 1
        "  vgpu:\n"  # 2
        "    preload: sometimes\n"  # 3
        "  rules:\n"  # 4
        "    privileged-gpu: deny\n"  # 5
        "    node-name-pinning: warn\n"  # 6
        "  mps:\n"  # 7
        "    pipeDirectory: /tmp/nvidia-mps\n"  # 8
        "  exemptions:\n"  # 9
        "    namespaces: [kube-system]\n"  # 10
        "  schedulerName: hami-scheduler\n"  # 11
        "  onError: maybe\n"  # 12
        "apiVersion: gpushare.io/v1alpha1\n"
        "kind: GPUSharePolicy\n"
    )

    result = run("lint", str(policy))

    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert [line.split(": ")[1] for line in lines] == ["line 3", "line 12"], result.stderr
    assert "spec.vgpu.preload" in lines[0]
    assert "spec.onError" in lines[1]


def test_lint_errors_on_one_line_are_in_column_order(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "apiVersion: gpushare.io/v1alpha1\n"
        "kind: GPUSharePolicy\n"
        "spec: {vgpu: {preload: sometimes}, onError: maybe}\n"
    )

    result = run("lint", str(policy))

    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr
    assert "spec.vgpu.preload" in lines[0]
    assert "spec.onError" in lines[1]


UNINSPECTED_NOTE = "kind PyTorchJob is not inspected: its pods are judged when they are created"


def test_review_notes_a_kind_it_does_not_inspect_in_every_output() -> None:
    manifest = str(MANIFESTS / "pytorchjob.yaml")

    text = run("review", "-f", manifest)
    as_json = run("review", "-f", manifest, "-o", "json")
    as_yaml = run("review", "-f", manifest, "-o", "yaml")

    assert text.returncode == as_json.returncode == as_yaml.returncode == 0
    assert "PyTorchJob ml/resnet: ALLOWED  mode=none" in text.stdout
    assert f"  note  {UNINSPECTED_NOTE}" in text.stdout
    (entry,) = json.loads(as_json.stdout)
    assert entry["allowed"] is True and entry["mode"] == "none"
    assert entry["warnings"] == [UNINSPECTED_NOTE]
    assert entry["patch"] == []
    assert yaml.safe_load(as_yaml.stdout)[0]["warnings"] == [UNINSPECTED_NOTE]


def test_review_does_not_note_uninspected_kinds_without_gpu_resources(tmp_path: Path) -> None:
    objects = tmp_path / "objects.yaml"
    objects.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\n"
        "data: {limits: 'nvidia.com/gpumem'}\n"
        "---\n"
        "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: cpu-only}\n"
        "spec:\n  pytorchReplicaSpecs:\n    Master:\n      template:\n        spec:\n"
        "          containers:\n            - name: main\n              image: torch\n"
        "              resources: {limits: {cpu: '2'}}\n"
    )

    result = run("review", "-f", str(objects), "-o", "json")

    assert result.returncode == 0, result.stderr
    assert [e["warnings"] for e in json.loads(result.stdout)] == [[], []]
