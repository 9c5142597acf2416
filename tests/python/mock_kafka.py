"""librdkafka's mock Kafka cluster (through confluent-kafka), as a second Kafka-protocol
broker for the black-box tests: `UNIMESH_TEST_BROKER=mock cargo test --test kafka`.

Prints `HOST:PORT` of its broker, then serves until killed. The mock cluster lives inside
this process's client; it implements produce, fetch, list offsets, consumer groups (with
cooperative-sticky), offset commit/fetch, idempotent producers and topic creation.
"""

import sys
import time

from confluent_kafka import Producer

client = Producer({"test.mock.num.brokers": 1, "bootstrap.servers": "", "log_level": 3})
meta = client.list_topics(timeout=10)
for broker in meta.brokers.values():
    print(f"{broker.host}:{broker.port}", flush=True)
while True:
    time.sleep(3600)
