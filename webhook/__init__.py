"""gpushare-webhook: admission webhook and policy enforcement for GPU sharing on Kubernetes."""

__version__ = "0.1.0"
