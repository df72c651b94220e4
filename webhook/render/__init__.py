"""The in-apiserver policies, rendered from a compiled policy: CEL text and admission objects.

Pure, as the core it renders: a :class:`~webhook.core.policy.Policy` in, CEL strings and
JSON objects out, no I/O. Its modules form layers, each importing only those below:

- :mod:`~webhook.render.cel`: the CEL builder (literals, lists, globs as RE2, the
  whitespace class, has-guarded reads, bindings).
- :mod:`~webhook.render.pod`: the pod vocabulary, written once: kinds and their template
  paths, container lists, resource asks, env reads, volumes and mounts.
- one module per rule family, each naming its core twin (``CORE_TWINS``):
  :mod:`~webhook.render.privilege`, :mod:`~webhook.render.env`,
  :mod:`~webhook.render.paths`, :mod:`~webhook.render.requests`,
  :mod:`~webhook.render.modes`, :mod:`~webhook.render.forged`,
  :mod:`~webhook.render.claims`; above them :mod:`~webhook.render.scheduling` and
  :mod:`~webhook.render.mutated`.
- what the objects share: :mod:`~webhook.render.variables`,
  :mod:`~webhook.render.messages`, :mod:`~webhook.render.admission`, and the webhooks'
  scope, :mod:`~webhook.render.scope`.
- the object assemblers: :mod:`~webhook.render.validating` (ValidatingAdmissionPolicies),
  :mod:`~webhook.render.mutating` (MutatingAdmissionPolicies), and
  :mod:`~webhook.render.targets`, the list of what an install renders.
"""
