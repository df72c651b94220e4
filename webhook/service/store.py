"""The policy in force, reloaded when its file changes or on SIGHUP.

A bad file never replaces a good policy: its errors are logged and counted, and the
last good policy keeps deciding (readiness stays up).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from webhook.files import Fingerprint, fingerprint
from webhook.policies import DEFAULT_POLICY, PolicyError, load_policy

log = logging.getLogger(__name__)


class PolicyStore:
    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path is not None else None
        self.listeners: list[Callable[[bool], None]] = []
        self._fingerprint: Fingerprint = None
        self._text: str | None = None
        if self.path is None:
            self.policy = DEFAULT_POLICY
        else:
            self._fingerprint = fingerprint(self.path)
            self.policy = load_policy(self.path)  # a bad file at start is fatal: raise
            self._text = self._read()

    def reload(self) -> bool:
        """Re-read the file; True when a new valid policy is in force."""
        if self.path is None:
            return False
        self._fingerprint = fingerprint(self.path)
        try:
            policy = load_policy(self.path)
        except PolicyError as exc:
            for error in exc.errors:
                log.error(
                    "policy reload refused, keeping %s: %s: %s",
                    self.policy.digest,
                    exc.source,
                    error,
                )
            self._notify(ok=False)
            return False
        changed = policy.digest != self.policy.digest
        self.policy = policy
        self._text = self._read()
        if changed:
            log.info("policy %s (%s) in force from %s", policy.name, policy.digest, self.path)
        self._notify(ok=True)
        return changed

    def text(self) -> str | None:
        """The policy file's text as last loaded (None for the bundled default): the leader
        marks what it renders with its fingerprint (webhook.install.fingerprint)."""
        return self._text

    def _read(self) -> str | None:
        # Read again after load_policy: a write in between is picked up by the next reload.
        try:
            return self.path.read_text("utf-8") if self.path is not None else None
        except (OSError, UnicodeDecodeError):
            return None

    def _notify(self, *, ok: bool) -> None:
        for listener in self.listeners:
            listener(ok)

    def changed_on_disk(self) -> bool:
        return self.path is not None and fingerprint(self.path) != self._fingerprint

    async def watch(self, interval: float = 1.0) -> None:
        """Poll the file; cheap (one stat) and works for ConfigMap symlink swaps."""
        while True:
            await asyncio.sleep(interval)
            if self.changed_on_disk():
                self.reload()
