#!/usr/bin/env python3
"""An outside client of unimesh: the Python `cloudevents` SDK publishes events in binary and
structured mode, then reads them back from a subscription group, parses each delivery with
the SDK and checks it arrived intact (attributes, data, and the emmqpartition/emmqoffset
the publish answer named). Driven by tests/tests/python_sdk.rs.

usage: publish_with_sdk.py HTTP_BASE_URL TOPIC GROUP

Prints {"sent": [...]} on stdout: per event its id, mode, the attributes and data as they
went over the wire, and the partition and offset of the publish answer. Exits non-zero,
saying why on stderr, if a publish is refused or a delivery differs from what was sent.

Works with cloudevents 1.x (`cloudevents.http`) and 2.x (`cloudevents.v1.http`).
"""

import base64
import json
import sys
import time
from datetime import datetime

try:  # cloudevents 1.x
    from cloudevents.conversion import to_binary, to_structured
    from cloudevents.http import CloudEvent, from_json
except ImportError:  # cloudevents 2.x keeps the same API under cloudevents.v1
    from cloudevents.v1.conversion import to_binary, to_structured
    from cloudevents.v1.http import CloudEvent, from_json
import requests

TIMEOUT_S = 60


def fail(msg):
    print(f"publish_with_sdk.py: {msg}", file=sys.stderr)
    sys.exit(1)


def events():
    """(mode, CloudEvent) pairs covering JSON, text and binary data in both modes."""
    base = {"source": "/python/sdk", "time": "2024-05-17T08:30:15.25+00:00"}
    return [
        ("binary", CloudEvent({**base, "id": "py-bin-json", "type": "com.example.order",
                               "subject": "orders/1", "tier": "gold",
                               "datacontenttype": "application/json"},
                              {"total": 42, "items": ["a", "b"], "note": "ünïcödé ✓"})),
        ("binary", CloudEvent({**base, "id": "py-bin-bytes", "type": "com.example.blob",
                               "datacontenttype": "application/octet-stream"},
                              bytes(range(256)))),
        ("binary", CloudEvent({**base, "id": "py-bin-text", "type": "com.example.text",
                               "datacontenttype": "text/plain"}, "plain text")),
        ("structured", CloudEvent({**base, "id": "py-st-json", "type": "com.example.order",
                                   "partitionkey": "customer-7", "region": "eu"},
                                  {"total": 7, "nested": {"ok": True, "n": None}})),
        ("structured", CloudEvent({**base, "id": "py-st-bytes", "type": "com.example.blob"},
                                  b"\x00\xffbinary\x01")),
        ("structured", CloudEvent({**base, "id": "py-st-nodata", "type": "com.example.ping"},
                                  None)),
    ]


def is_json_type(ct):
    essence = (ct or "").split(";")[0].strip().lower()
    return essence == "application/json" or essence.endswith("+json")


def wire_view(mode, headers, body):
    """The attributes and data a receiver must see, worked out from the bytes on the wire
    (by the CloudEvents HTTP binding), not from the SDK's own idea of the event."""
    headers = {k.lower(): v for k, v in headers.items()}
    if mode == "structured":
        obj = json.loads(body)
        attrs = {k: v for k, v in obj.items() if k not in ("data", "data_base64")}
        if "data_base64" in obj:
            return attrs, {"data_base64": obj["data_base64"]}
        if "data" in obj:
            return attrs, {"data": obj["data"]}
        return attrs, {}
    attrs = {k[3:]: v for k, v in headers.items() if k.startswith("ce-")}
    ct = headers.get("content-type")
    if ct is not None:
        attrs["datacontenttype"] = ct
    if not body:
        return attrs, {}
    if is_json_type(ct):
        return attrs, {"data": json.loads(body)}
    if (ct or "").lower().startswith("text/"):
        return attrs, {"data": body.decode("utf-8")}
    return attrs, {"data_base64": base64.b64encode(body).decode("ascii")}


def same_time(a, b):
    def parse(s):
        return datetime.fromisoformat(s.replace("Z", "+00:00"))
    return parse(a) == parse(b)


def check_delivery(sent, delivered):
    """Compares one delivery (parsed by the SDK) with what was sent; returns problems."""
    problems = []
    # Through the JSON event format, which is what decodes data_base64.
    ev = from_json(json.dumps(delivered))
    got = dict(ev.get_attributes())
    for k, want in sent["attributes"].items():
        have = got.get(k)
        if have is None:
            problems.append(f"attribute {k} missing")
        elif k == "time":
            if not same_time(str(have), want):
                problems.append(f"time {have!r} != {want!r}")
        elif str(have) != str(want):
            problems.append(f"attribute {k}: {have!r} != {want!r}")
    for k, want in (("emmqpartition", sent["partition"]), ("emmqoffset", sent["offset"])):
        if str(got.get(k)) != str(want):
            problems.append(f"{k} {got.get(k)!r} != {want} (the publish answer)")
    data = ev.get_data()
    if "data_base64" in sent:
        want = base64.b64decode(sent["data_base64"])
        if data != want:
            problems.append(f"binary data {data!r} != {want!r}")
    elif "data" in sent:
        if data != sent["data"]:
            problems.append(f"data {data!r} != {sent['data']!r}")
    elif data is not None:
        problems.append(f"data {data!r} where none was sent")
    return problems


def main():
    if len(sys.argv) != 4:
        fail("usage: publish_with_sdk.py HTTP_BASE_URL TOPIC GROUP")
    base, topic, group = sys.argv[1:]
    session = requests.Session()
    session.trust_env = False  # never route 127.0.0.1 through a proxy from the environment
    sent = []
    for mode, event in events():
        headers, body = to_binary(event) if mode == "binary" else to_structured(event)
        r = session.post(f"{base}/v1/topics/{topic}/events", headers=headers, data=body,
                         timeout=TIMEOUT_S)
        if r.status_code != 200:
            fail(f"{mode} publish of {event['id']} answered {r.status_code}: {r.text}")
        results = r.json().get("results", [])
        if len(results) != 1 or results[0].get("id") != event["id"]:
            fail(f"publish of {event['id']}: unexpected answer {r.text}")
        attrs, data = wire_view(mode, headers, body)
        sent.append({"id": event["id"], "mode": mode, "attributes": attrs, **data,
                     "partition": results[0]["partition"], "offset": results[0]["offset"]})

    by_id = {s["id"]: s for s in sent}
    seen = {}
    deadline = time.monotonic() + TIMEOUT_S
    while len(seen) < len(sent):
        if time.monotonic() > deadline:
            fail(f"only {sorted(seen)} of {sorted(by_id)} were delivered to {group}")
        r = session.get(f"{base}/v1/subscriptions/{group}/events",
                        params={"client": "python", "max": 100, "waitMs": 1000},
                        timeout=TIMEOUT_S)
        if r.status_code != 200:
            fail(f"poll answered {r.status_code}: {r.text}")
        ids = []
        for d in r.json():
            ev = d["event"]
            s = by_id.get(ev.get("id"))
            if s is None:
                fail(f"delivered an event that was not sent: {ev}")
            if ev["id"] in seen:
                fail(f"{ev['id']} delivered twice")
            problems = check_delivery(s, ev)
            if problems:
                fail(f"{ev['id']} ({s['mode']}) did not arrive intact: {problems}; got {ev}")
            seen[ev["id"]] = d["deliveryId"]
            ids.append(d["deliveryId"])
        if ids:
            r = session.post(f"{base}/v1/subscriptions/{group}/ack",
                             json={"deliveryIds": ids}, timeout=TIMEOUT_S)
            if r.status_code != 200 or r.json().get("acked") != len(ids):
                fail(f"ACK answered {r.status_code}: {r.text}")
    json.dump({"sent": sent}, sys.stdout)


if __name__ == "__main__":
    main()
