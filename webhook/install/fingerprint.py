"""Which policy an admission object was rendered from, in a form Helm can compute too.

Every ValidatingAdmissionPolicy, MutatingAdmissionPolicy and binding the install renders
from a policy carries :data:`ANNOTATION`, and so does every matchConditions text the CLI
prints (:data:`CONDITIONS_KEY`). The Helm chart computes the same value from the policy it
puts into its ConfigMap and refuses to render when an admission object carries another:
a custom policy can then never be installed with the default policy's mutation (or CEL
rules, or scope), and no leader has to put it right afterwards.

The value is the SHA-256 of the policy document's ``spec`` as written (what it leaves out
is not filled in: Helm cannot merge it with the default), encoded as JSON the way Go's
``encoding/json`` encodes what Helm's ``fromYaml`` parses: Helm's ``toJson`` then gives
the same bytes (``sha256sum (toJson $spec)``). YAML is read as Go's YAML library reads it
into an ``interface{}``: timestamps stay the strings they were written as, every number
is a float64.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable
from decimal import Decimal
from typing import Any, Final

import yaml

ANNOTATION: Final = "gpushare.io/policy-spec"
# The key of the fingerprint in `manifests --print-match-conditions` output.
CONDITIONS_KEY: Final = "policySpec"
_HTML: Final = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"}
_SEPARATORS: Final = {"\u2028": "\\u2028", "\u2029": "\\u2029"}


class _Loader(yaml.SafeLoader):
    """SafeLoader reading plain scalars as Go's YAML library (gopkg.in/yaml.v2, behind Helm's
    ``fromYaml`` and values files) reads them into an ``interface{}``: an unquoted date stays
    the string it was written as, ``1e3`` is a number, ``y`` and ``n`` are booleans."""

    def construct_yaml_bool(self, node: yaml.ScalarNode) -> bool:
        value = str(self.construct_scalar(node)).lower()
        return value in ("y", "yes", "true", "on")


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"), list("yYnN"))
# A float with an exponent and no dot (YAML 1.1 wants one; Go parses it as a number).
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)?\.?[0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)
_Loader.add_constructor("tag:yaml.org,2002:bool", _Loader.construct_yaml_bool)


def fingerprint_loader() -> type[yaml.SafeLoader]:
    """The YAML loader the fingerprint reads documents with (as Go's library reads them)."""
    return _Loader


def _go_float(value: float) -> str:
    """``encoding/json``'s float64: the shortest digits, plain between 1e-6 and 1e21,
    else an exponent without a leading zero (``1e-7``, ``1e+21``)."""
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"{value} has no JSON form")
    if value == 0:
        return "0" if math.copysign(1.0, value) > 0 else "-0"
    shortest = Decimal(repr(value))
    if 1e-6 <= abs(value) < 1e21:
        text = format(shortest, "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    mantissa, _, exponent = format(shortest, "e").partition("e")
    mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
    sign = "-" if exponent.startswith("-") else "+"
    return f"{mantissa}e{sign}{exponent.lstrip('+-').lstrip('0') or '0'}"


def _go_string(value: str) -> str:
    text = json.dumps(value, ensure_ascii=False)
    for plain, escaped in (*_HTML.items(), *_SEPARATORS.items()):
        text = text.replace(plain, escaped)
    return text


def _go_key(key: Any) -> str:
    """A mapping key as Go's YAML-to-JSON conversion spells it."""
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, float):
        return _go_float(key)
    return "null" if key is None else str(key)


def go_json(value: Any) -> str:
    """``value`` (parsed YAML) as Go's ``json.Marshal`` writes it after ``fromYaml``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        # fromYaml reads every number into a float64.
        return _go_float(float(value))
    if isinstance(value, str):
        return _go_string(value)
    if isinstance(value, dict):
        items = sorted((_go_key(key), item) for key, item in value.items())
        return "{" + ",".join(f"{_go_string(k)}:{go_json(v)}" for k, v in items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(go_json(item) for item in value) + "]"
    raise TypeError(f"no JSON form for {type(value).__name__}")


def spec_fingerprint(text: str) -> str:
    """``sha256:<hex>`` of the ``spec`` of the policy document ``text`` (``{}`` when it
    has none), as the chart computes it."""
    document = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    spec = document.get("spec") if isinstance(document, dict) else None
    return "sha256:" + hashlib.sha256(go_json(spec or {}).encode()).hexdigest()


def stamp(objects: Iterable[dict[str, Any]], fingerprint: str) -> None:
    """Mark every object of ``objects`` as rendered from the policy of ``fingerprint``."""
    for obj in objects:
        metadata = obj.setdefault("metadata", {})
        metadata["annotations"] = {**(metadata.get("annotations") or {}), ANNOTATION: fingerprint}
