"""The policy fingerprint: what Python computes is what the chart computes with Helm.

Helm is the other implementation (``sha256sum (toJson $spec)`` over what ``fromYaml`` or a
values file parsed): a tiny chart prints its value for each document, by both routes the
chart takes (``policy.file`` through ``fromYaml``, ``policy.spec`` as a values block).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.install.chart import HELM_MAJORS, find_helm, run
from tests.paths import DEFAULT_POLICY_FILE, EXAMPLES
from webhook.install.fingerprint import ANNOTATION, go_json, spec_fingerprint, stamp

DOCUMENTS = {
    "numbers": "spec: {a: 1, b: 1.0, c: 0.00001, d: 1e-7, e: 1.5e21, f: -3, g: 16384, h: 0.1, "
    "i: 1e3, j: 0x10, k: 010, l: 1_000, m: .5, p: +1}\n",
    "strings": 'spec:\n  html: \'<a href="x">&</a>\'\n  unicode: "grüße \\u2028 ✓"\n'
    "  quoted: \"tab\\there\\nnewline \\u0001 \\b \\f\"\n  empty: ''\n",
    "scalars": "spec: {yes: yes, off: off, n: null, t: true, date: 2026-01-31, "
    "at: 2026-01-31T10:00:00Z, y: Y, o: On, nl: ~}\n",
    "nested": "spec:\n  z: [1, [2, {b: 1, a: 2}], {}]\n  a: {c: {}, b: []}\n",
    "no-spec": "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\n",
    "empty-spec": "spec: {}\n",
    "default": DEFAULT_POLICY_FILE.read_text("utf-8"),
    **{path.stem: path.read_text("utf-8") for path in sorted(EXAMPLES.glob("*.yaml"))},
}

TEMPLATE = """\
{{- range $name, $text := .Values.files }}
{{ $name }}/file: sha256:{{ toJson ((fromYaml $text).spec | default dict) | sha256sum }}
{{- end }}
{{- range $name, $spec := .Values.specs }}
{{ $name }}/spec: sha256:{{ toJson $spec | sha256sum }}
{{- end }}
"""


@pytest.fixture(scope="module", params=HELM_MAJORS, ids=lambda major: f"helm{major}")
def helm(request: pytest.FixtureRequest) -> str:
    return find_helm(request.param)


def test_helm_computes_the_same_fingerprint(helm: str, tmp_path: Path) -> None:
    chart = tmp_path / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: fingerprint\nversion: 0.1.0\n")
    (chart / "templates" / "out.yaml").write_text(TEMPLATE)
    specs = {}
    for name, text in DOCUMENTS.items():
        spec = yaml.load(text, Loader=yaml.SafeLoader) or {}
        if spec.get("spec"):
            # As a values block: the text of the spec's mapping, re-indented.
            specs[name] = text
    values = tmp_path / "values.yaml"
    lines = ["files:"]
    for name, text in DOCUMENTS.items():
        lines.append(f"  {name}: |")
        lines += [f"    {line}" for line in text.splitlines()]
    lines.append("specs:")
    for name, text in specs.items():
        body = text[text.index("spec:") + len("spec:") :]
        lines.append(f"  {name}:{body.splitlines()[0]}")
        lines += [f"  {line}" for line in body.splitlines()[1:]]
    values.write_text("\n".join(lines) + "\n")
    result = run([helm, "template", "x", str(chart), "--values", str(values)])
    assert result.returncode == 0, result.stderr
    computed = dict(
        line.split(": ", 1) for line in result.stdout.splitlines() if line and ": " in line
    )
    for name, text in DOCUMENTS.items():
        assert computed[f"{name}/file"] == spec_fingerprint(text), name
    for name in specs:
        assert computed[f"{name}/spec"] == spec_fingerprint(DOCUMENTS[name]), name
    assert len(specs) >= 8


def test_go_json_writes_numbers_and_strings_as_go_does() -> None:
    assert go_json({"b": 1.0, "a": [1e-7, 0.00001, 1.5e21, 1e21, -0.5]}) == (
        '{"a":[1e-7,0.00001,1.5e+21,1e+21,-0.5],"b":1}'
    )
    assert go_json("<&>\u2028\n") == '"\\u003c\\u0026\\u003e\\u2028\\n"'
    with pytest.raises(ValueError, match="no JSON form"):
        go_json(float("nan"))


def test_the_fingerprint_ignores_what_is_not_the_spec() -> None:
    plain = "spec: {rules: {gpu-quota: deny}}\n"
    named = "# a comment\napiVersion: gpushare.io/v1alpha1\nmetadata: {name: x}\n" + plain
    assert spec_fingerprint(plain) == spec_fingerprint(named)
    assert spec_fingerprint(plain) != spec_fingerprint("spec: {rules: {gpu-quota: warn}}\n")


def test_stamp_keeps_other_annotations() -> None:
    objects = [{"metadata": {"annotations": {"a": "b"}}}, {}]
    stamp(objects, "sha256:x")
    assert objects[0]["metadata"]["annotations"] == {"a": "b", ANNOTATION: "sha256:x"}
    assert objects[1]["metadata"]["annotations"] == {ANNOTATION: "sha256:x"}
