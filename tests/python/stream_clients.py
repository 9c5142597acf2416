"""Outside clients of unimesh's delivery streams, used as a user would use them:
sseclient-py (over requests) for Server-Sent Events and websocket-client for WebSocket.

    python3 stream_clients.py BASE_URL

Needs the groups sse-g (topic sse-t) and ws-g (topic ws-t), made by the calling test.
Prints one JSON summary on stdout; the calling test (tests/tests/python_streams.rs) checks it.
"""
import json
import sys

import requests
import sseclient
import websocket

BASE = sys.argv[1].rstrip("/")


def publish(topic, ids):
    events = [{"specversion": "1.0", "id": i, "source": "/py", "type": "py.t", "data": {"id": i}}
              for i in ids]
    r = requests.post(f"{BASE}/v1/topics/{topic}/events", data=json.dumps(events),
                      headers={"content-type": "application/cloudevents-batch+json"}, timeout=60)
    r.raise_for_status()


def ack(group, ids):
    r = requests.post(f"{BASE}/v1/subscriptions/{group}/ack", json={"deliveryIds": ids}, timeout=60)
    r.raise_for_status()
    return r.json()


def sse_read(last_event_id, want):
    """Reads `want` deliveries from the group's stream, then drops the connection."""
    headers = {"accept": "text/event-stream"}
    if last_event_id:
        headers["Last-Event-ID"] = last_event_id
    r = requests.get(f"{BASE}/v1/subscriptions/sse-g/stream?client=py-sse", stream=True,
                     headers=headers, timeout=60)
    r.raise_for_status()
    got = []
    for ev in sseclient.SSEClient(r).events():
        if not ev.data:
            continue
        d = json.loads(ev.data)
        assert d["deliveryId"] == ev.id, (d, ev.id)
        got.append(d)
        if len(got) == want:
            break
    r.close()
    return got


def sse():
    publish("sse-t", ["s0", "s1", "s2", "s3"])
    first = sse_read(None, 2)  # drops mid-stream, two deliveries not yet read
    acked = ack("sse-g", [first[0]["deliveryId"]])
    after = sse_read(first[-1]["deliveryId"], 3)  # the un-ACKed one again, and the two unread
    done = ack("sse-g", [d["deliveryId"] for d in after])
    return {
        "first": [[d["event"]["id"], d["attempt"]] for d in first],
        "after": [[d["event"]["id"], d["attempt"]] for d in after],
        "acked": acked["acked"] + done["acked"],
    }


def ws_url(client):
    return BASE.replace("http://", "ws://") + f"/v1/subscriptions/ws-g/ws?client={client}"


def ws():
    publish("ws-t", ["w0", "w1"])
    conn = websocket.create_connection(ws_url("py-ws"), timeout=60)
    d0 = json.loads(conn.recv())
    d1 = json.loads(conn.recv())
    conn.send(json.dumps({"nack": [d0["deliveryId"]], "delayMs": 0}))
    nacked = json.loads(conn.recv())
    again = json.loads(conn.recv())
    conn.send(json.dumps({"ack": [again["deliveryId"], d1["deliveryId"]]}))
    acked = json.loads(conn.recv())
    conn.close()

    bad = websocket.create_connection(ws_url("py-garbage"), timeout=60)
    errors = []
    for garbage in ["not json", "{\"ack\": 5}", "{\"frobnicate\": []}"]:
        bad.send(garbage)
        errors.append(json.loads(bad.recv()))
    opcode, data = bad.recv_data(control_frame=True)
    close_code = int.from_bytes(data[:2], "big") if opcode == websocket.ABNF.OPCODE_CLOSE else None
    return {
        "delivered": [[d0["event"]["id"], d0["attempt"]], [d1["event"]["id"], d1["attempt"]]],
        "nack_answer": nacked,
        "again": [again["event"]["id"], again["attempt"]],
        "ack_answer": acked,
        "errors": [e.get("error") for e in errors],
        "close_code": close_code,
    }


print(json.dumps({"sse": sse(), "ws": ws()}))
