"""The install: Kubernetes objects rendered from ``deploy/``."""
