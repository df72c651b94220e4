"""Certificates: issuing, files on disk, SSL contexts with live reload, rotation
decisions, the Lease and the self-managed loop."""
