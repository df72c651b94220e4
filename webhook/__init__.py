"""gpushare-webhook: admission webhook and policy enforcement for GPU sharing on Kubernetes."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    # Looked up when asked for: reading package metadata costs every import otherwise.
    if name == "__version__":
        from webhook.version import version

        return version()
    raise AttributeError(f"module 'webhook' has no attribute {name!r}")
