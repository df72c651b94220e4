"""Files the service watches (the policy, certificates), told apart by what is on disk."""

from __future__ import annotations

import os

Fingerprint = tuple[int, int, int, int] | None


def fingerprint(path: str | os.PathLike[str] | None) -> Fingerprint:
    """What identifies a file's content on disk, following symlinks; None when absent.

    Kubernetes ConfigMap and Secret volumes swap a ``..data`` symlink atomically, so
    the inode behind the path changes even when mtime and size do not.
    """
    if path is None:
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino, stat.st_mtime_ns, stat.st_size)
