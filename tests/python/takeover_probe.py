"""Diagnostic, not a test: two plain confluent-kafka consumers in one group on a broker;
SIGKILL one; does the survivor take its partitions, and how soon? ASSIGN_SLEEP_S makes the
survivor's assign callback slow (as unimesh's, which reads progress), STRATEGY picks the
assignor, SESSION_MS the session timeout, LEADER_DIES=S starts the killed one S seconds first (the leader), DEBUG=cgrp librdkafka's group logs (issue 18).
NUDGE=S: from S seconds after the kill, a third client in the group, never subscribed,
commits offset 0 of a topic that does not exist once a second (what unimesh's
shell/src/storage/kafka/io/nudge.rs does for a stuck rebalance; tansu 0.6.0 with LEADER_DIES=4: no
takeover in 3 of 3 runs without, takeover 12.1 s after the kill in 3 of 3 with NUDGE=8).

    TOPIC=t1 python3 tests/python/takeover_probe.py 127.0.0.1:PORT
"""
import os, signal, subprocess, sys, time
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

BROKER = sys.argv[1]
ROLE = sys.argv[2] if len(sys.argv) > 2 else "main"
STRATEGY = os.environ.get("STRATEGY", "cooperative-sticky")
SLEEP = float(os.environ.get("ASSIGN_SLEEP_S", "0"))
SESSION = os.environ.get("SESSION_MS", "6000")
TOPIC = os.environ.get("TOPIC", "t1")
DEBUG = os.environ.get("DEBUG", "")

def consumer(name):
    conf = {"bootstrap.servers": BROKER, "group.id": "g-" + TOPIC, "client.id": name,
            "partition.assignment.strategy": STRATEGY, "session.timeout.ms": SESSION,
            "heartbeat.interval.ms": "500", "enable.auto.commit": "false",
            "auto.offset.reset": "earliest"}
    if os.environ.get("INSTANCE"):
        conf["group.instance.id"] = name
    if DEBUG:
        conf["debug"] = DEBUG
    return Consumer(conf)

def log(*a):
    print(f"{time.time():.3f}", *a, flush=True)

def run(name, slow):
    c = consumer(name)
    owned = set()
    def on_assign(c, parts):
        log(name, "assign", [p.partition for p in parts])
        if slow and SLEEP:
            time.sleep(SLEEP)
            log(name, "assign callback done")
        owned.update(p.partition for p in parts)
    def on_revoke(c, parts):
        log(name, "revoke", [p.partition for p in parts])
        owned.difference_update(p.partition for p in parts)
    def on_lost(c, parts):
        log(name, "LOST", [p.partition for p in parts])
        on_revoke(c, parts)
    c.subscribe([TOPIC], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    return c, owned

if ROLE == "child":
    c, owned = run("a", False)
    while True:
        c.poll(0.1)
else:
    admin = AdminClient({"bootstrap.servers": BROKER})
    for f in admin.create_topics([NewTopic(TOPIC, 4, 1)]).values():
        f.result(10)
    p = Producer({"bootstrap.servers": BROKER})
    for i in range(40):
        p.produce(TOPIC, key=str(i), value=b"x", partition=i % 4)
    log("unflushed", p.flush(10))
    child = subprocess.Popen([sys.executable, __file__, BROKER, "child"])
    if os.environ.get("LEADER_DIES"):
        # The killed consumer joins first, so it is the group's leader (issue 18).
        time.sleep(float(os.environ.get("LEADER_DIES")))
    c, owned = run("b", True)
    start = time.time()
    while time.time() - start < 60:
        c.poll(0.1)
        if len(owned) == 2:
            break
    log("b owns", sorted(owned), "before kill")
    time.sleep(3)
    child.send_signal(signal.SIGKILL)
    killed = time.time()
    log("killed a")
    nudger, last_nudge = None, 0.0
    if os.environ.get("NUDGE"):
        nudger = Consumer({"bootstrap.servers": BROKER, "group.id": "g-" + TOPIC,
                           "client.id": "nudge", "enable.auto.commit": "false"})
    while time.time() - killed < float(os.environ.get("WAIT_S", "60")):
        c.poll(0.1)
        now = time.time()
        if nudger and now - killed >= float(os.environ["NUDGE"]) and now - last_nudge >= 1.0:
            last_nudge = now
            try:
                nudger.commit(offsets=[TopicPartition("__unimesh_group_nudge", 0, 0)],
                              asynchronous=False)
            except Exception as e:  # refused (unknown topic): only the request matters
                log("nudge:", e)
        if len(owned) == 4:
            log(f"TAKEOVER after {time.time()-killed:.1f}s")
            break
    else:
        log("NO TAKEOVER; b owns", sorted(owned))
    c.close()
