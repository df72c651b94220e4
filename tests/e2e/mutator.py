"""A second mutating webhook for the reinvocation test, run as its own process.

It annotates every pod it sees (once), so a webhook that ran before it is reinvoked;
with ``sidecar`` it also adds a container that asks for no GPU, which a mutation that
ran before it must then void when reinvoked.
Usage: python tests/e2e/mutator.py PORT CERT KEY [sidecar]
"""

from __future__ import annotations

import base64
import ssl
import sys
from typing import Any

import orjson
from aiohttp import web

ANNOTATION = "e2e.gpushare.io/touched"
SIDECAR = {"name": "e2e-sidecar", "image": "busybox:1.36"}
ADDS_SIDECAR = web.AppKey("adds_sidecar", bool)


async def mutate(request: web.Request) -> web.Response:
    review = await request.json()
    pod = review["request"]["object"]
    annotations = pod["metadata"].get("annotations") or {}
    response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": True}
    if annotations.get(ANNOTATION) != "yes":
        patch: list[dict[str, Any]] = [
            {"op": "add", "path": "/metadata/annotations/e2e.gpushare.io~1touched", "value": "yes"}
        ]
        if not annotations:
            patch = [{"op": "add", "path": "/metadata/annotations", "value": {ANNOTATION: "yes"}}]
        if request.app[ADDS_SIDECAR]:
            patch.append({"op": "add", "path": "/spec/containers/-", "value": SIDECAR})
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
    return web.json_response(
        {"apiVersion": review["apiVersion"], "kind": "AdmissionReview", "response": response}
    )


def main() -> None:
    port, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    app = web.Application()
    app[ADDS_SIDECAR] = sys.argv[4:] == ["sidecar"]
    app.router.add_post("/mutate", mutate)
    web.run_app(app, host="127.0.0.1", port=port, ssl_context=context, print=None)


if __name__ == "__main__":
    main()
