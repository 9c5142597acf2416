#!/usr/bin/env python3
"""HTTPS calls of tests/tls.rs made by Python `requests`, as users make them.

Usage: tls_requests.py CALLS.json — prints one JSON line per call on stdout.

CALLS: [{"name", "method", "url", "verify": CA_PEM, "cert"?: [CERT_PEM, KEY_PEM], "event"?}].
Each call is `requests.request(method, url, cert=(cert, key), verify=ca, timeout=30)`,
with `event` sent as a structured CloudEvent (`application/cloudevents+json`), and with
requests' defaults otherwise (a new session per call, so no connection is
reused across calls). Its line: {"name", "status", "body"} for an answer, or {"name",
"error": the exception's class, "message": its text} when no answer came (an SSL error,
a reset connection).
"""
import json
import sys

import requests


def call(c):
    kwargs = {"verify": c["verify"], "timeout": 30}
    if "cert" in c:
        kwargs["cert"] = tuple(c["cert"])
    if "event" in c:
        kwargs["data"] = json.dumps(c["event"])
        kwargs["headers"] = {"content-type": "application/cloudevents+json"}
    try:
        r = requests.request(c["method"], c["url"], **kwargs)
    except requests.exceptions.RequestException as e:
        return {"name": c["name"], "error": type(e).__name__, "message": str(e)}
    return {"name": c["name"], "status": r.status_code, "body": r.text}


def main():
    with open(sys.argv[1]) as f:
        calls = json.load(f)
    print(f"requests {requests.__version__}", file=sys.stderr)
    for c in calls:
        print(json.dumps(call(c)), flush=True)


if __name__ == "__main__":
    main()
