"""An outside Kafka client for the black-box tests: Confluent's confluent-kafka.

    kafka_client.py produce BROKERS TOPIC     # writes the records below, prints their offsets
    kafka_client.py consume BROKERS TOPIC N   # reads N records from the beginning, prints them
    kafka_client.py records BROKERS GROUP TOPIC PARTITION   # the lane's live progress
        # records, one JSON object each: {"generation", "leader_epoch"} (header values)
    kafka_client.py progress BROKERS GROUP TOPIC PARTITION WATERMARK [stale] [epoch=E]
        # writes a progress record (unimesh's checkpoint encoding, no ranges) for the lane,
        # as if a group had reached WATERMARK: to test a resume offset the log does not have.
        # The record is keyed as the lane's last owner's (its ownership generation, the
        # highest one in the topic: shell/src/storage/kafka/io/progress/); with `stale`, as an owner
        # replaced before it (one generation lower): a zombie's late write, which the
        # lane's next owner must ignore. Without stamped records, the lane's one key.
        # Written to partition 0, where unimesh writes every progress record. With
        # `epoch=E`, stamped as written by a lane whose position was in leader epoch E
        # (the header unimesh-leader-epoch: shell/src/storage/kafka/rules/epochs.rs).

`produce` writes, in this order: a binary-mode CloudEvent (ce_* headers, key = its
partitionkey), a structured-mode CloudEvent (content-type application/cloudevents+json)
and a record that is no CloudEvent at all. It prints one JSON object per line:
{"kind", "id", "partition", "offset"}.

`consume` prints one JSON object per record: {"partition", "offset", "key", "headers":
{name: value}, "value"} (value as UTF-8 text), and exits non-zero when fewer than N records
arrive within 60 s.
"""

import json
import struct
import sys
import time
import zlib

from confluent_kafka import Consumer, Producer


def produce(brokers, topic):
    producer = Producer({"bootstrap.servers": brokers, "acks": "all", "enable.idempotence": True})
    results = []

    def report(kind, ident):
        def cb(err, msg):
            if err is not None:
                raise SystemExit(f"delivery of {kind} failed: {err}")
            results.append({"kind": kind, "id": ident, "partition": msg.partition(), "offset": msg.offset()})
        return cb

    producer.produce(
        topic,
        key=b"order-7",
        value=json.dumps({"amount": 42}).encode(),
        headers=[
            ("ce_specversion", b"1.0"),
            ("ce_id", b"py-binary-1"),
            ("ce_source", b"/python/confluent-kafka"),
            ("ce_type", b"com.example.order.created"),
            ("ce_subject", "caf\u00e9".encode()),
            ("ce_partitionkey", b"order-7"),
            ("ce_tenant", b"acme"),
            ("content-type", b"application/json"),
        ],
        on_delivery=report("binary", "py-binary-1"),
    )
    structured = {
        "specversion": "1.0",
        "id": "py-structured-1",
        "source": "/python/confluent-kafka",
        "type": "com.example.order.shipped",
        "datacontenttype": "text/plain",
        "data": "shipped",
    }
    producer.produce(
        topic,
        key=b"order-7",
        value=json.dumps(structured).encode(),
        headers=[("content-type", b"application/cloudevents+json; charset=utf-8")],
        on_delivery=report("structured", "py-structured-1"),
    )
    producer.produce(topic, key=b"order-7", value=b"not an event", on_delivery=report("junk", None))
    left = producer.flush(30)
    if left:
        raise SystemExit(f"{left} records not delivered")
    for r in results:
        print(json.dumps(r))


def consume(brokers, topic, n):
    consumer = Consumer({
        "bootstrap.servers": brokers,
        "group.id": f"outside-reader-{time.time_ns()}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    consumer.subscribe([topic])
    got = 0
    deadline = time.time() + 60
    while got < n and time.time() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            print(f"consumer error: {msg.error()}", file=sys.stderr)
            continue
        headers = {k: v.decode("utf-8") for k, v in (msg.headers() or [])}
        print(json.dumps({
            "partition": msg.partition(),
            "offset": msg.offset(),
            "key": msg.key().decode("utf-8") if msg.key() is not None else None,
            "headers": headers,
            "value": msg.value().decode("utf-8") if msg.value() is not None else None,
        }), flush=True)
        got += 1
    consumer.close()
    if got < n:
        raise SystemExit(f"read {got} of {n} records")


def owner_generations(brokers, lane):
    """The ownership generations of the lane's live progress records (None: unstamped)."""
    return list(live_records(brokers, lane))


def live_records(brokers, lane):
    """The lane's live progress records: {ownership generation (None: unstamped): the
    value of their unimesh-leader-epoch header (None: none)}."""
    from confluent_kafka import TopicPartition

    consumer = Consumer({"bootstrap.servers": brokers, "group.id": "kafka-client-progress",
                         "enable.auto.commit": False})
    meta = consumer.list_topics("unimesh.progress", timeout=30)
    parts = list(meta.topics["unimesh.progress"].partitions)
    highs = {p: consumer.get_watermark_offsets(TopicPartition("unimesh.progress", p), timeout=30)[1]
             for p in parts}
    consumer.assign([TopicPartition("unimesh.progress", p, 0) for p in parts])
    live = {}
    deadline = time.time() + 60
    done = {p for p, hi in highs.items() if hi <= 0}
    while len(done) < len(parts):
        if time.time() > deadline:
            raise SystemExit("the progress topic could not be read to its end")
        m = consumer.poll(0.5)
        if m is None or m.error():
            continue
        if m.offset() + 1 >= highs[m.partition()]:
            done.add(m.partition())
        if m.key() is None:
            continue
        key = m.key().decode()
        if key == lane:
            gen = None
        elif key.startswith(lane + "\n"):
            gen = int(key[len(lane) + 1:])
        else:
            continue
        if m.value() is None:
            live.pop(gen, None)
        else:
            epoch = dict(m.headers() or []).get("unimesh-leader-epoch")
            live[gen] = None if epoch is None else epoch.decode()
    consumer.close()
    return live


def progress(brokers, group, topic, partition, watermark, stale=False, epoch=None):
    # core/src/checkpoint.rs: "UMCK" | version 1 | watermark u64 | 0 ranges | 0 attempts | crc32
    body = b"UMCK" + bytes([1]) + struct.pack("<QII", watermark, 0, 0)
    value = body + struct.pack("<I", zlib.crc32(body))
    lane = f"{group}\n{topic}\n{partition}"
    stamped = [g for g in owner_generations(brokers, lane) if g is not None]
    if stamped:
        gen = max(stamped) - 1 if stale else max(stamped)
        key = f"{lane}\n{gen}"
    else:
        # Unstamped records (a shell that does not fence): one key per lane, the newest
        # record wins — a zombie's write is just that.
        key = lane
    producer = Producer({"bootstrap.servers": brokers, "acks": "all"})
    # Where unimesh writes every progress record (shell/src/storage/kafka/io/progress/,
    # HOME_PARTITION), not where this client's partitioner would put the key: a key in two
    # partitions has no newest record.
    headers = [] if epoch is None else [("unimesh-leader-epoch", str(epoch).encode())]
    producer.produce("unimesh.progress", key=key.encode(), value=value, partition=0,
                     headers=headers)
    if producer.flush(30):
        raise SystemExit("progress record not delivered")
    print(json.dumps({"written": True, "key": key}))


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "produce":
        produce(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 5 and sys.argv[1] == "consume":
        consume(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) >= 6 and sys.argv[1] == "records":
        lane = f"{sys.argv[3]}\n{sys.argv[4]}\n{sys.argv[5]}"
        for gen, epoch in live_records(sys.argv[2], lane).items():
            print(json.dumps({"generation": gen, "leader_epoch": epoch}))
    elif len(sys.argv) >= 7 and sys.argv[1] == "progress":
        extra = sys.argv[7:]
        epochs = [int(a[len("epoch="):]) for a in extra if a.startswith("epoch=")]
        progress(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]),
                 stale="stale" in extra, epoch=epochs[0] if epochs else None)
    else:
        raise SystemExit(__doc__)
