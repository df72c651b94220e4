"""Files the edges read and write: change detection by what is on disk, atomic writes."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

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


def write_atomic(path: Path, data: bytes, *, mode: int) -> None:
    """Replace ``path`` with ``data`` at ``mode``; readers see the old or the new file.

    Raises OSError; the temporary file is removed whatever fails.
    """
    # mkstemp creates the file 0600, so a key is never readable by others, not even
    # for the moment before a chmod; rename makes readers see the old or the new file.
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
            os.fchmod(file.fileno(), mode)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
