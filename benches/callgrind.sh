#!/bin/sh
# Instructions per delivery of each core bench scenario, counted by callgrind over a fixed
# number of deliver+ACK cycles (`src/bin/cycles.rs`): repeatable run to run, unlike times.
#
# Usage: benches/callgrind.sh [DELIVERIES]   (default 100000; CARGO_TARGET_DIR is honoured)
set -eu
deliveries=${1:-100000}
cd "$(dirname "$0")/.."
cargo build -q -p unimesh-benches --release --bin cycles
target=${CARGO_TARGET_DIR:-target}
out=$(mktemp -d)
for scenario in "1 1" "100000 1" "100000 64"; do
    set -- $scenario
    valgrind --tool=callgrind --collect-atstart=no \
        --toggle-collect='*Rig*measured_rounds*' \
        --callgrind-out-file="$out/cg.$1.$2" \
        "$target/release/cycles" "$1" "$2" "$deliveries" >/dev/null 2>"$out/log.$1.$2"
    ir=$(callgrind_annotate "$out/cg.$1.$2" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }')
    n=$(( deliveries / $2 * $2 ))
    echo "in_flight=$1 ack_batch=$2: $ir instructions / $n deliveries = $(( ir / n )) per delivery"
done
rm -rf "$out"
