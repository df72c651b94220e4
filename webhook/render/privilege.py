"""privileged-gpu and node-name-pinning in CEL: a privileged container or CAP_SYS_ADMIN in a
GPU pod, a GPU pod created with spec.nodeName.

Held equal to its core twins (:data:`CORE_TWINS`) by the differential tests.
"""

from __future__ import annotations

from typing import Final

from webhook.core import rules as core_rules
from webhook.core.rules import SYS_ADMIN
from webhook.render.cel import strings, upper

# The core functions this family renders: a rename there breaks the import here.
CORE_TWINS: Final = (core_rules.evaluate, core_rules.node_name_pinning, core_rules.host_namespaces)


def privileged_gpu(containers: str, gpu: str, spec: str) -> str:
    """A privileged container, or one adding CAP_SYS_ADMIN (the toolkit's isPrivileged)."""
    caps = "c.securityContext.capabilities"
    return (
        f"{gpu} && {containers}.exists(c, has(c.securityContext) && ("
        "(has(c.securityContext.privileged) && c.securityContext.privileged == true) || "
        f"(has({caps}) && has({caps}.add) && {caps}.add.exists(a, "
        f"{upper('a')} in {strings(sorted(SYS_ADMIN))}))))"
    )


def node_name_pinning(containers: str, gpu: str, spec: str) -> str:
    return f"variables.created && {gpu} && has({spec}.nodeName) && {spec}.nodeName != ''"
