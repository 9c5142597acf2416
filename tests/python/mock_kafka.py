"""librdkafka's mock Kafka cluster (the librdkafka that confluent-kafka ships), as a second
Kafka-protocol broker for the black-box tests: `UNIMESH_TEST_BROKER=mock cargo test --test
kafka`, and the tests that need what only the mock can do (a new leader epoch).

Prints `HOST:PORT` of its broker, then serves until killed. The mock cluster lives inside
this process; it implements produce, fetch, list offsets, consumer groups (with
cooperative-sticky), offset commit/fetch, OffsetForLeaderEpoch, idempotent producers and
topic creation, and stamps every record batch with its partition's leader epoch.

Commands, one per line on stdin, each answered with one line on stdout:
    leader TOPIC PARTITION   # elects the partition's leader again: a new leader epoch
                             # (records appended from now on carry it) -> "ok" | "error N"
    errors API CODE COUNT    # the next COUNT requests of Kafka API key API (2: ListOffsets)
                             # are answered with error CODE (6: not leader) -> "ok"
    clear API                # drops the errors still queued for API -> "ok"
    advertise HOST PORT      # the broker's address in metadata answers becomes HOST:PORT
                             # (a proxy in front of it) -> "ok" | "error N"

The cluster is driven through librdkafka's C API (ctypes): confluent-kafka's Python API has
no handle on the mock cluster.
"""

import ctypes
import ctypes.util
import glob
import os
import sys
import time

import confluent_kafka


def librdkafka():
    """The librdkafka confluent-kafka loads: its bundled copy, else the system's."""
    here = os.path.dirname(os.path.dirname(confluent_kafka.__file__))
    bundled = sorted(glob.glob(os.path.join(here, "confluent_kafka.libs", "librdkafka*.so*")))
    name = bundled[0] if bundled else (ctypes.util.find_library("rdkafka") or "librdkafka.so.1")
    lib = ctypes.CDLL(name)
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                      ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_conf_set.restype = ctypes.c_int
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p,
                                 ctypes.c_size_t]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_handle_mock_cluster.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_handle_mock_cluster.restype = ctypes.c_void_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_partition_set_leader.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                                       ctypes.c_int32, ctypes.c_int32]
    lib.rd_kafka_mock_partition_set_leader.restype = ctypes.c_int
    lib.rd_kafka_mock_push_request_errors_array.argtypes = [
        ctypes.c_void_p, ctypes.c_int16, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)]
    lib.rd_kafka_mock_push_request_errors_array.restype = None
    lib.rd_kafka_mock_clear_request_errors.argtypes = [ctypes.c_void_p, ctypes.c_int16]
    lib.rd_kafka_mock_clear_request_errors.restype = None
    lib.rd_kafka_mock_broker_set_host_port.argtypes = [ctypes.c_void_p, ctypes.c_int32,
                                                       ctypes.c_char_p, ctypes.c_int]
    lib.rd_kafka_mock_broker_set_host_port.restype = ctypes.c_int
    return lib


def main():
    lib = librdkafka()
    err = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    for k, v in (("test.mock.num.brokers", "1"), ("log_level", "3")):
        if lib.rd_kafka_conf_set(conf, k.encode(), v.encode(), err, len(err)) != 0:
            raise SystemExit(f"{k}: {err.value.decode()}")
    rk = lib.rd_kafka_new(0, conf, err, len(err))  # RD_KAFKA_PRODUCER
    if not rk:
        raise SystemExit(f"cannot create the client: {err.value.decode()}")
    cluster = lib.rd_kafka_handle_mock_cluster(rk)
    if not cluster:
        raise SystemExit("the client has no mock cluster")
    print(lib.rd_kafka_mock_cluster_bootstraps(cluster).decode(), flush=True)
    for line in sys.stdin:
        words = line.split()
        if len(words) == 3 and words[0] == "leader":
            # The one broker (id 1) leads again, in a new epoch.
            code = lib.rd_kafka_mock_partition_set_leader(cluster, words[1].encode(),
                                                          int(words[2]), 1)
            print("ok" if code == 0 else f"error {code}", flush=True)
        elif len(words) == 4 and words[0] == "errors":
            api, code, count = int(words[1]), int(words[2]), int(words[3])
            errors = (ctypes.c_int * count)(*([code] * count))
            lib.rd_kafka_mock_push_request_errors_array(cluster, api, count, errors)
            print("ok", flush=True)
        elif len(words) == 2 and words[0] == "clear":
            lib.rd_kafka_mock_clear_request_errors(cluster, int(words[1]))
            print("ok", flush=True)
        elif len(words) == 3 and words[0] == "advertise" and words[2].isdigit():
            code = lib.rd_kafka_mock_broker_set_host_port(cluster, 1, words[1].encode(),
                                                          int(words[2]))
            print("ok" if code == 0 else f"error {code}", flush=True)
        else:
            print(f"error unknown command {line.strip()!r}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
