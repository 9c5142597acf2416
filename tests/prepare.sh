#!/usr/bin/env bash
# Installs what the test suite's outside parts need, reusing what is already there:
#   - Python clients from PyPI, as users run them: cloudevents (the SDK publishing test),
#     sseclient-py and websocket-client (the delivery stream clients, tests/python_streams.rs),
#     confluent-kafka (the outside Kafka client and librdkafka's mock cluster, tests/kafka*.rs),
#     schemathesis (the OpenAPI conformance run, tests/schemathesis/run.sh), PyJWT (the
#     issuer minting the tokens of tests/jwt.rs);
#   - the tansu Kafka-protocol broker (the Kafka backend's tests start one per test on a free
#     loopback port, in memory, and stop it when the test ends: tests/src/kafka.rs), built
#     with cargo outside the clone — about 10 minutes cold on two cores, reused after;
#   - Debian's chromium and playwright-core from npm (tests/browser.rs and tests/console.rs
#     drive a real headless browser): chromium by apt-get when missing and this runs as
#     root, else it says so.
# Then `cargo test --workspace` finds tansu at $TANSU_ROOT/bin/tansu (or set UNIMESH_TANSU).
set -euo pipefail

python3 -m pip install --quiet --disable-pip-version-check 'cloudevents==2.2.0' \
  'requests>=2.31,<3' 'sseclient-py==1.9.0' 'websocket-client==1.9.2' 'schemathesis==4.32.5' \
  'confluent-kafka==2.12.1' 'PyJWT[crypto]==2.15.1'

TANSU_VERSION=0.6.0
TANSU_ROOT="${TANSU_ROOT:-/var/tmp/tansu-install}"
if ! "$TANSU_ROOT/bin/tansu" --version 2>/dev/null | grep -q "$TANSU_VERSION"; then
  echo "building tansu $TANSU_VERSION into $TANSU_ROOT (once; about 10 minutes cold)"
  cargo install tansu --locked --version "$TANSU_VERSION" --features dynostore \
    --root "$TANSU_ROOT" --target-dir "${TANSU_BUILD_DIR:-/var/tmp/tansu-build}"
fi
"$TANSU_ROOT/bin/tansu" --version

cd "$(dirname "$0")"
if ! command -v "${UNIMESH_CHROMIUM:-chromium}" >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian's chromium (tests/browser.rs, tests/console.rs)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
  else
    echo "tests/browser.rs and tests/console.rs need Chromium: install Debian's chromium package (or set UNIMESH_CHROMIUM)" >&2
  fi
fi
npm ci --prefix browser --no-audit --no-fund --loglevel=error
