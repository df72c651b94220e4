"""The install's ValidatingAdmissionPolicies evaluated as kube-apiserver evaluates them,
without Go: the unit-level half of the CEL differential (tests/e2e/test_celpolicy.py is
the other, through a real kube-apiserver).

The evaluator is cel-expr-python, the CEL project's Python binding of its C++
implementation (cel-cpp): CEL's grammar, type checker, macros (``all``, ``exists``,
``filter``, ``map``), ``has()``, error absorption by ``&&`` and ``||``, the strings
extension (``lowerAscii``, ``replace``, ``split``, ``join``, ``substring``, ``indexOf``,
...), and ``matches`` on RE2, the syntax Go's regexp (the apiserver's) implements, so
``\\x{...}`` classes run as written. The other candidates, tried on the default policy's
rendering: cel-python (pure Python) and common-expression-language (the Rust
implementation) have neither the strings extension (every ``lowerAscii``, ``split``,
``join``, ``substring``, ``indexOf`` would have been written here) nor a type checker; a
small interpreter of the renderer's subset would have been a second CEL to trust.
What Kubernetes adds to CEL is not in it, and is added here as extensions
answering as kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/cel/library does at
v1.36.3:

- quantity.go:155-191 (``quantity``, ``isQuantity``, ``compareTo``, ``isInteger``,
  ``asInteger``), on tests/render/kubequantity.py. A quantity is held as its text (the
  binding declares no opaque types from Python): each member parses it again.
- lists.go:151-175 and 213-245, 286-312 (``sum``, ``indexOf``, ``lastIndexOf`` on lists).

As the apiserver evaluates a policy: the matchConditions first (any false: no validation
runs; an error fails the request under failurePolicy Fail:
admission/plugin/webhook/matchconditions/matcher.go:80-140), then each validation
(admission/plugin/policy/validating/validator.go:85); ``variables.<name>`` is bound to
each variable's value in declaration order, a variable whose evaluation errs left unbound,
so that reading it errs where it is read, as the apiserver's lazy map of variables answers
(admission/plugin/cel/composition.go:197-254).

Not mirrored: the cost limits (tests/e2e/test_celpolicy.py holds a large pod to them), and
the apiserver's compilation against the objects' OpenAPI schemas (every input here is
``dyn``): the e2e test compiles what is rendered.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import jsonpatch
from cel_expr_python import cel
from cel_expr_python.ext import ext_strings

from tests.render import kubequantity
from webhook.render.cel import call_args

Obj = dict[str, Any]

_T: Final = cel.Type
_RULE: Final = re.compile(r"\[([a-z-]+)\] ")
# The strings extension at the version the apiserver declares (environment/base.go:125-129).
_STRINGS_VERSION: Final = 2


class QuantityError(ValueError):
    """What ``quantity()`` and ``asInteger()`` answer where Go's return an error."""


def _quantity(text: str) -> kubequantity.Quantity:
    parsed = kubequantity.parse(text)
    if parsed is None:
        raise QuantityError(f"quantities must match the regular expression: {text!r}")
    return parsed


def _to_quantity(text: str) -> str:
    _quantity(text)
    return text


def _is_quantity(text: str) -> bool:
    return kubequantity.parse(text) is not None


def _compare_to(left: str, right: str) -> int:
    return _quantity(left).cmp(_quantity(right))


def _is_integer(text: str) -> bool:
    return _quantity(text).as_int64() is not None


def _as_integer(text: str) -> int:
    value = _quantity(text).as_int64()
    if value is None:
        raise QuantityError("cannot convert value to integer")
    return value


def equal(left: Any, right: Any) -> bool:
    """CEL's ``==`` on the values the binding hands Python: numbers across int and
    double, no bool equal to a number, lists and maps element by element."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return left == right
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(equal, left, right))
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(equal(v, right[k]) for k, v in left.items())
    return type(left) is type(right) and bool(left == right)


def _index_of(items: list[Any], item: Any) -> int:
    return next((i for i, each in enumerate(items) if equal(each, item)), -1)


def _last_index_of(items: list[Any], item: Any) -> int:
    found = [i for i, each in enumerate(items) if equal(each, item)]
    return found[-1] if found else -1


def _sum(items: list[Any]) -> Any:
    """The integers' sum (an error past int64) or the doubles': the runtime dispatches on
    the argument's kind (a list), so one overload serves both of lists.go's."""
    if not items:
        return 0
    if all(isinstance(i, int) and not isinstance(i, bool) for i in items):
        total = sum(items)
        if not kubequantity.INT64_MIN <= total <= kubequantity.INT64_MAX:
            raise OverflowError("integer overflow")
        return total
    if all(isinstance(i, float) for i in items):
        return float(sum(items))
    raise TypeError("no such overload: sum")


def _overload(
    name: str, result: Any, parameters: Sequence[Any], impl: Callable[..., Any], *, member: bool
) -> Any:
    return cel.Overload(name, result, list(parameters), is_member=member, impl=impl)


def _range(n: int) -> list[int]:
    return list(range(n))


def _flatten(items: list[Any]) -> list[Any]:
    """cel-go's ``flatten()`` (ext/lists.go): one level, other elements kept."""
    return [x for item in items for x in (item if isinstance(item, list) else [item])]


def _reverse(items: list[Any]) -> list[Any]:
    return list(reversed(items))


def _escape_key(key: str) -> str:
    """``jsonpatch.escapeKey`` (library/jsonpatch.go): RFC 6901's escapes."""
    return key.replace("~", "~0").replace("/", "~1")


def _entries(items: list[Any]) -> dict[Any, Any]:
    """The map that ``transformMapEntry`` builds from one-entry maps (see
    :func:`mutation_text`): a key made twice is an error, as in cel-go."""
    merged: dict[Any, Any] = {}
    for item in items:
        for key, value in item.items():
            if key in merged:
                raise ValueError(f"insert failed: key {key!r} already exists")
            merged[key] = value
    return merged


def _kubernetes_library() -> Any:
    """The Kubernetes CEL functions the renderer uses, as one extension; and cel-go's
    lists functions (``lists.range``, ``flatten``, ``reverse``), which the apiserver
    declares (environment/base.go) and cel-cpp's binding does not have."""
    string, integer, boolean = _T.STRING, _T.INT, _T.BOOL
    dyn_list = _T.List(_T.DYN)
    declarations = {
        "lists.range": [
            _overload("lists_range", _T.List(integer), [integer], _range, member=False)
        ],
        "flatten": [_overload("list_flatten", dyn_list, [dyn_list], _flatten, member=True)],
        "reverse": [_overload("list_reverse", dyn_list, [dyn_list], _reverse, member=True)],
        "jsonpatch.escapeKey": [
            _overload("jsonpatch_escape_key", string, [string], _escape_key, member=False)
        ],
        _ENTRIES: [
            _overload("list_entries", _T.Map(_T.DYN, _T.DYN), [dyn_list], _entries, member=True)
        ],
        "quantity": [_overload("string_to_quantity", string, [string], _to_quantity, member=False)],
        "isQuantity": [
            _overload("is_quantity_string", boolean, [string], _is_quantity, member=False)
        ],
        "compareTo": [
            _overload("quantity_compare_to", integer, [string, string], _compare_to, member=True)
        ],
        "isInteger": [
            _overload("quantity_is_integer", boolean, [string], _is_integer, member=True)
        ],
        "asInteger": [_overload("quantity_get_int", integer, [string], _as_integer, member=True)],
        "sum": [_overload("list_sum", _T.DYN, [dyn_list], _sum, member=True)],
        "indexOf": [
            _overload("list_a_index_of_int", integer, [dyn_list, _T.DYN], _index_of, member=True)
        ],
        "lastIndexOf": [
            _overload(
                "list_a_last_index_of_int", integer, [dyn_list, _T.DYN], _last_index_of, member=True
            )
        ],
    }
    functions = [cel.FunctionDecl(name, overloads) for name, overloads in declarations.items()]
    return cel.CelExtension("kubernetes", functions)


def environment() -> Any:
    """A CEL environment with what a ValidatingAdmissionPolicy's expressions may read."""
    names = ("object", "oldObject", "request", "variables")
    return cel.NewEnv(
        variables=dict.fromkeys(names, _T.DYN),
        extensions=[ext_strings.ExtStrings(_STRINGS_VERSION), _kubernetes_library()],
    )


class CelError(RuntimeError):
    """An expression that does not compile, or a result of the wrong type."""


@dataclass(frozen=True)
class Outcome:
    """A policy's verdict on one request: whether its matchConditions held, the rule ids
    of the validations that evaluated to false, and the errors met (by rule id, or the
    name of the matchCondition)."""

    matched: bool
    failed: frozenset[str]
    errors: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Compiled:
    name: str
    program: Any


def rule_of(message: str) -> str:
    """The rule id a validation's message starts with (``[privileged-gpu] ...``)."""
    match = _RULE.match(message)
    if match is None:
        raise CelError(f"a validation message without its rule: {message[:60]!r}")
    return match.group(1)


class Policy:
    """One rendered ValidatingAdmissionPolicy, compiled."""

    def __init__(self, obj: Mapping[str, Any], env: Any | None = None) -> None:
        self.name: str = obj["metadata"]["name"]
        spec = obj["spec"]
        env = env if env is not None else environment()
        self.conditions = [
            self._compile(env, c["name"], c["expression"]) for c in _items(spec, "matchConditions")
        ]
        self.variables = [
            self._compile(env, v["name"], v["expression"]) for v in _items(spec, "variables")
        ]
        self.validations = [
            self._compile(env, rule_of(v["message"]), v["expression"])
            for v in _items(spec, "validations")
        ]

    @property
    def rules(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.validations)

    @staticmethod
    def _compile(env: Any, name: str, expression: str) -> _Compiled:
        try:
            return _Compiled(name, env.compile(expression))
        except RuntimeError as error:
            raise CelError(f"{name}: {error}") from error

    def evaluate(self, obj: Any, request: Mapping[str, Any], *, old: Any = None) -> Outcome:
        """The policy's verdict on ``request`` for ``obj`` (and ``old`` on an UPDATE)."""
        data: Obj = {"object": obj, "oldObject": old, "request": dict(request), "variables": {}}
        errors: dict[str, str] = {}
        for condition in self.conditions:
            value = condition.program.eval(data=data)
            if _is_error(value):
                errors[condition.name] = str(value.plain_value())
                continue
            if value.plain_value() is not True:
                return Outcome(matched=False, failed=frozenset(), errors=errors)
        if errors:
            return Outcome(matched=True, failed=frozenset(), errors=errors)
        bound: Obj = {}
        for variable in self.variables:
            value = variable.program.eval(data={**data, "variables": bound})
            if not _is_error(value):
                bound[variable.name] = value.plain_value()
        data["variables"] = bound
        failed = set()
        for validation in self.validations:
            value = validation.program.eval(data=data)
            if _is_error(value):
                errors[validation.name] = str(value.plain_value())
            elif value.plain_value() is not True:
                failed.add(validation.name)
        return Outcome(matched=True, failed=frozenset(failed), errors=errors)


class MutatingPolicy:
    """One rendered MutatingAdmissionPolicy of JSONPatch mutations, compiled, run as the
    apiserver runs it: its matchConditions (all true, or nothing happens; an error is
    raised, which failurePolicy Fail makes a refusal), then each mutation in order on the
    object the previous one left, its variables bound afresh
    (admission/plugin/policy/mutating/dispatcher.go:139-216, patch/json_patch.go:72-116 @ v0.36.3:
    the ops applied by RFC 6902, as the ``jsonpatch`` package applies them)."""

    def __init__(self, obj: Mapping[str, Any], env: Any | None = None) -> None:
        self.name: str = obj["metadata"]["name"]
        spec = obj["spec"]
        env = env if env is not None else environment()

        def compiled(name: str, expression: str) -> _Compiled:
            return Policy._compile(env, name, mutation_text(expression))

        self.conditions = [
            compiled(c["name"], c["expression"]) for c in _items(spec, "matchConditions")
        ]
        self.variables = [compiled(v["name"], v["expression"]) for v in _items(spec, "variables")]
        self.mutations = []
        for number, mutation in enumerate(_items(spec, "mutations")):
            if mutation["patchType"] != "JSONPatch":
                raise CelError(f"mutation {number}: not a JSONPatch: {mutation['patchType']}")
            self.mutations.append(
                compiled(f"mutation {number}", mutation["jsonPatch"]["expression"])
            )

    def matches(self, obj: Any, request: Mapping[str, Any]) -> bool:
        data: Obj = {"object": obj, "oldObject": None, "request": dict(request), "variables": {}}
        for condition in self.conditions:
            value = condition.program.eval(data=data)
            if _is_error(value):
                raise CelError(f"{self.name}: {condition.name}: {value.plain_value()}")
            if value.plain_value() is not True:
                return False
        return True

    def mutate(self, obj: Obj, request: Mapping[str, Any]) -> tuple[Obj, list[Obj]]:
        """``obj`` as the policy leaves it, and the ops its mutations made (none where its
        matchConditions do not hold)."""
        if not self.matches(obj, request):
            return obj, []
        made: list[Obj] = []
        for mutation in self.mutations:
            data: Obj = {"object": obj, "oldObject": None, "request": dict(request)}
            bound: Obj = {}
            for variable in self.variables:
                value = variable.program.eval(data={**data, "variables": bound})
                if not _is_error(value):
                    bound[variable.name] = value.plain_value()
            value = mutation.program.eval(data={**data, "variables": bound})
            if _is_error(value):
                raise CelError(f"{self.name}: {mutation.name}: {value.plain_value()}")
            ops = value.plain_value()
            if not isinstance(ops, list):
                raise CelError(f"{self.name}: {mutation.name}: not a list of ops: {ops!r}")
            obj = jsonpatch.apply_patch(obj, ops)
            made += ops
        return obj, made


# Read for what cel-cpp's binding parses (see mutation_text): ``transformMapEntry`` is a
# two-variable comprehension (cel-go's ext/comprehensions.go), which it does not have;
# ``JSONPatch{...}`` is a type only the apiserver declares (library/jsonpatch.go).
_ENTRIES: Final = "entriesMap"
_TRANSFORM: Final = ".transformMapEntry("
_PATCH_FIELDS: Final = (
    (re.compile(r"JSONPatch\{\s*op:"), "{'op':"),
    (re.compile(r",\s*path:"), ", 'path':"),
    (re.compile(r",\s*value:"), ", 'value':"),
)


def mutation_text(expression: str) -> str:
    """``expression`` as cel-cpp's binding reads it, meaning the same:
    ``L.transformMapEntry(i, c, {k: v})`` as ``L.map(c, {k: v}).entriesMap()`` (the
    renderer never reads the index ``i``; :func:`_entries` errs on a key made twice, as
    the comprehension does), and ``JSONPatch{op: o, path: p, value: v}`` as the map
    ``{'op': o, 'path': p, 'value': v}`` that the apiserver turns it into."""
    while (at := expression.find(_TRANSFORM)) != -1:
        (_, item, body), end = call_args(expression, at + len(_TRANSFORM) - 1)
        expression = f"{expression[:at]}.map({item}, {body}).{_ENTRIES}(){expression[end:]}"
    for pattern, replacement in _PATCH_FIELDS:
        expression = pattern.sub(replacement, expression)
    return expression


def _items(spec: Mapping[str, Any], key: str) -> list[Obj]:
    items = spec.get(key) or []
    return [dict(item) for item in items]


def _is_error(value: Any) -> bool:
    return bool(value.type() == _T.ERROR)


# The API group, version and resource of each kind the pod policies match.
RESOURCES: Final[Mapping[str, tuple[str, str, str]]] = {
    "Pod": ("", "v1", "pods"),
    "ReplicationController": ("", "v1", "replicationcontrollers"),
    "Deployment": ("apps", "v1", "deployments"),
    "StatefulSet": ("apps", "v1", "statefulsets"),
    "DaemonSet": ("apps", "v1", "daemonsets"),
    "ReplicaSet": ("apps", "v1", "replicasets"),
    "Job": ("batch", "v1", "jobs"),
    "CronJob": ("batch", "v1", "cronjobs"),
}


def admission_request(
    kind: str,
    *,
    namespace: str,
    name: str,
    operation: str = "CREATE",
    username: str = "",
    groups: Sequence[str] = (),
    sub_resource: str = "",
) -> Obj:
    """``request`` as a policy reads it: the AdmissionRequest the apiserver makes
    (admission/plugin/policy/validating/dispatcher.go), as unstructured JSON (empty fields
    left out, as its omitempty tags leave them out)."""
    group, version, resource = RESOURCES[kind]
    user: Obj = {"username": username}
    if groups:
        user["groups"] = list(groups)
    request: Obj = {
        "uid": "00000000-0000-0000-0000-000000000000",
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": resource},
        "requestKind": {"group": group, "version": version, "kind": kind},
        "requestResource": {"group": group, "version": version, "resource": resource},
        "name": name,
        "namespace": namespace,
        "operation": operation,
        "userInfo": user,
        "dryRun": True,
    }
    if sub_resource:
        request["subResource"] = request["requestSubResource"] = sub_resource
    return request
