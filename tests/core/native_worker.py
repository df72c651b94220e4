"""Answers AdmissionReviews with the ``webhook`` this interpreter imports, one JSON line
in, one out: the compiled core's side of tests/core/test_native.py.

Run by path with the unpacked wheel (hack/build-native) on PYTHONPATH, so ``webhook``
is the compiled build; the test imports :func:`outcome` from here for the source's
side, so both sides compute the same thing.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import webhook.core.decision
from webhook.core.admission import answer
from webhook.core.policy import Policy
from webhook.core.wire import Endpoint, ReviewError, parse_review
from webhook.policies import parse_policy


def outcome(policy: Policy, endpoint: Endpoint, body: Any) -> dict[str, Any]:
    """What the service would answer ``body`` with, and the decision behind it."""
    try:
        version, request = parse_review(body)
    except ReviewError as exc:
        return {"malformed": str(exc)}
    try:
        result = answer(version, request, policy, endpoint=endpoint)
    except Exception as exc:  # the server turns it into an onError answer: compare that
        return {"raised": type(exc).__name__}
    decision = result.decision
    return {
        "review": result.review,
        "violations": decision.violations,
        "redacted": decision.redacted,
        "mode": decision.mode,
    }


def main() -> None:
    # The stdlib's json, not orjson: generated junk holds integers beyond 64 bits.
    print(json.dumps({"core": webhook.core.decision.__file__}), flush=True)
    policies: dict[str, Policy] = {}
    for line in sys.stdin:
        message = json.loads(line)
        text = message["policy"]
        policy = policies.get(text) or policies.setdefault(text, parse_policy(text))
        answered = outcome(policy, message["endpoint"], message["review"])
        print(json.dumps(answered), flush=True)


if __name__ == "__main__":
    main()
