"""Writes python_sdk.json: HTTP publish requests produced by the Python `cloudevents` SDK.

The Rust test `event::tests::python_sdk_fixtures` parses each request with the publish
parser and compares the result with the attributes and data the SDK itself reports, so the
parser is checked against an outside implementation rather than against our own encoder.

Regenerate with:  pip install cloudevents==2.2.0 && python3 gen_fixtures.py
"""

import base64
import json
import os
import re
from datetime import datetime, timezone

from cloudevents.core.bindings import http as core_http
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent as CoreEvent
from cloudevents.v1.conversion import to_binary as v1_to_binary
from cloudevents.v1.conversion import to_structured as v1_to_structured
from cloudevents.v1.http import CloudEvent as V1Event

TIME = datetime(2024, 5, 17, 8, 30, 15, 250000, tzinfo=timezone.utc)


def b64(b):
    return base64.b64encode(b).decode("ascii")


def is_json(content_type):
    return content_type is None or bool(
        re.match(r"^(application|text)/([a-z0-9.+-]+\+)?json(;.*)?$", content_type)
    )


def expected_data(headers, body):
    """The data a receiver must see, by the CloudEvents HTTP binding and JSON format rules,
    worked out here from the wire bytes (the SDKs differ on how they encode text)."""
    content_type = headers.get("content-type")
    if content_type.startswith("application/cloudevents+json"):
        doc = json.loads(body)
        if "data_base64" in doc:
            return {"data_bytes_base64": doc["data_base64"]}
        if is_json(doc.get("datacontenttype")):
            return {"data_json": doc["data"]}
        return {"data_text": doc["data"]}
    if is_json(content_type):
        return {"data_json": json.loads(body)}
    if content_type.startswith("text/"):
        return {"data_text": body.decode("utf-8")}
    return {"data_bytes_base64": b64(body)}


def request(name, headers, body, attrs):
    """attrs: what the SDK itself says the event's attributes are, every one as a string."""
    body = body if isinstance(body, bytes) else body.encode("utf-8")
    expect = {}
    for k, v in attrs.items():
        if v is None:
            continue
        expect[k] = v.isoformat().replace("+00:00", "Z") if isinstance(v, datetime) else str(v)
    return {
        "name": name,
        "headers": [[k, v] for k, v in headers.items()],
        "body_base64": b64(body),
        "expect": {"attributes": expect, **expected_data(headers, body)},
    }


CASES = [
    (
        "json",
        {
            "id": "e-json-1",
            "type": "com.example.order.created",
            "source": "https://example.com/shop",
            "subject": "order-42",
            "partitionkey": "cust-7",
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "time": TIME,
            "datacontenttype": "application/json",
        },
        {"amount": 12.5, "note": "caf\u00e9 \u2615", "items": [1, 2, 3]},
    ),
    (
        "unicode",
        {
            "id": "e-uni-\u00e9",
            "type": "com.example.\u00fcnicode",
            "source": "/shop/eu",
            "time": TIME,
            "subject": "na\u00efve \"quoted\" 100% \u65e5\u672c",
            "comment": "\u2615 and spaces",
            "datacontenttype": "text/plain; charset=utf-8",
        },
        "h\u00e9llo w\u00f6rld \u65e5\u672c",
    ),
    (
        "bytes",
        {
            "id": "e-bin-1",
            "type": "com.example.blob",
            "source": "urn:example:blob",
            "time": TIME,
            "datacontenttype": "application/octet-stream",
        },
        bytes([0, 1, 2, 255, 254, 0x7B, 0x22]),
    ),
]


def main():
    fixtures = []
    fmt = JSONFormat()
    for name, attrs, data in CASES:
        ev = CoreEvent(attributes=dict(attrs), data=data)
        got = ev.get_attributes()
        msg = core_http.to_binary(ev, fmt)
        fixtures.append(request(f"core-binary-{name}", msg.headers, msg.body, got))
        msg = core_http.to_structured(ev, fmt)
        fixtures.append(request(f"core-structured-{name}", msg.headers, msg.body, got))

        v1_attrs = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in attrs.items()}
        ev = V1Event(dict(v1_attrs), data)
        got = {k: v for k, v in ev.get_attributes().items()}
        headers, body = v1_to_binary(ev)
        fixtures.append(request(f"v1-binary-{name}", headers, body, got))
        headers, body = v1_to_structured(ev)
        fixtures.append(request(f"v1-structured-{name}", headers, body, got))

    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_sdk.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(fixtures, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
