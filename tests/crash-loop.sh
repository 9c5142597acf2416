#!/usr/bin/env bash
# Runs a crash test binary again and again, to count rare failures (issue 23): each run's
# output in LOGDIR/run-N.out, a failed test's whole server stderr under LOGDIR (by
# UNIMESH_TEST_LOGS), the Kafka backend's debug lines on (UNIMESH_TEST_SERVER_LOG).
#   usage: tests/crash-loop.sh RUNS LOGDIR [test filter, e.g. on_kafka]
# Build the binaries first (`cargo test --workspace --no-run --test crash`); set UNIMESH_BIN
# to pin the server binary, CRASH_BIN to the test binary (else the newest in the target dir).
set -uo pipefail
runs=$1; logs=$2; filter=${3:-}
target=${CARGO_TARGET_DIR:-target}
bin=${CRASH_BIN:-$(ls -t "$target"/debug/deps/crash-* 2>/dev/null | grep -v '\.d$' | head -1)}
[ -x "$bin" ] || { echo "no crash test binary (set CRASH_BIN)"; exit 2; }
mkdir -p "$logs"
pass=0; fail=0
for i in $(seq 1 "$runs"); do
  start=$(date +%s)
  if UNIMESH_TEST_LOGS="$logs" UNIMESH_TEST_SERVER_LOG="${UNIMESH_TEST_SERVER_LOG:-info,unimesh_shell::kafka=debug}" \
      "$bin" $filter > "$logs/run-$i.out" 2>&1; then
    pass=$((pass + 1)); echo "run $i ok $(( $(date +%s) - start ))s"
  else
    fail=$((fail + 1)); echo "run $i FAILED $(( $(date +%s) - start ))s"
    grep -E "panicked|C2|SEED|kills after" "$logs/run-$i.out" | head -6
  fi
done
echo "$pass passed, $fail failed"
