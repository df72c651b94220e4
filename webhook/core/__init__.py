"""The pure decision core: plain data in (review, policy), a verdict and JSON Patch out.

Nothing in this package does I/O: no sockets, no TLS, no files, no Kubernetes client.
The edges (``webhook.service``, ``webhook.cli``, ...) are thin adapters around it; an
import-linter contract in ``pyproject.toml`` keeps it that way.
"""
