"""What kube-controller-manager's namespace controller does, for the dev cluster, which runs
none: a deleted Namespace is emptied and then finalized, instead of staying Terminating.

The controller (kubernetes pkg/controller/namespace/deletion) deletes every namespaced
resource the apiserver serves in the namespace, by collection, and then removes its
``kubernetes`` finalizer through the ``finalize`` subresource; the apiserver deletes the
Namespace once no finalizer is left. This does the same, polling, without the controller's
retries for objects that hold finalizers of their own (nothing here would remove those).
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import urllib.error
import urllib.request
from typing import Any, Final

log = logging.getLogger(__name__)

_FINALIZER: Final = "kubernetes"


class NamespaceFinalizer:
    """Empties and finalizes every Terminating Namespace of the apiserver at ``server``."""

    def __init__(self, *, server: str, token: str, ca_file: str, interval: float = 1.0) -> None:
        self._server = server
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self._context = ssl.create_default_context(cafile=ca_file)
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="namespace-finalizer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {**self._headers, **({"Content-Type": "application/json"} if data else {})}
        request = urllib.request.Request(  # noqa: S310  # https to our own loopback apiserver
            self._server + path, data=data, method=method, headers=headers
        )
        with urllib.request.urlopen(request, context=self._context, timeout=10) as response:  # noqa: S310
            return json.loads(response.read() or b"null")

    def _collections(self) -> list[str]:
        """The path of every namespaced resource that can be deleted by collection, with
        ``{ns}`` for the namespace."""
        versions = ["/api/v1"]
        for group in self._call("GET", "/apis").get("groups") or []:
            preferred = group.get("preferredVersion") or {}
            if preferred.get("groupVersion"):
                versions.append(f"/apis/{preferred['groupVersion']}")
        paths = []
        for root in versions:
            for resource in self._call("GET", root).get("resources") or []:
                verbs = resource.get("verbs") or []
                collection = resource.get("namespaced") and "/" not in resource["name"]
                if collection and "deletecollection" in verbs:
                    paths.append(f"{root}/namespaces/{{ns}}/{resource['name']}")
        return paths

    def finalize_once(self) -> list[str]:
        """One pass: the Namespaces finalized."""
        done = []
        for namespace in self._call("GET", "/api/v1/namespaces").get("items") or []:
            metadata = namespace.get("metadata") or {}
            finalizers = (namespace.get("spec") or {}).get("finalizers") or []
            if not metadata.get("deletionTimestamp") or _FINALIZER not in finalizers:
                continue
            name = metadata["name"]
            for path in self._collections():
                try:
                    self._call("DELETE", path.format(ns=name))
                except urllib.error.HTTPError as exc:
                    # Not every served resource stores objects (405) or lets admin delete.
                    log.debug("deletecollection %s: %s", path.format(ns=name), exc.code)
            namespace["spec"]["finalizers"] = [f for f in finalizers if f != _FINALIZER]
            self._call("PUT", f"/api/v1/namespaces/{name}/finalize", namespace)
            done.append(name)
        return done

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                for name in self.finalize_once():
                    log.info("namespace %s emptied and finalized", name)
            except (OSError, ValueError) as exc:
                log.debug("namespace finalizer: %s", exc)
