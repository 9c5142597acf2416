#!/usr/bin/env bash
# Checks the monitoring files in deploy/ with Prometheus's own tool:
#   - `promtool check rules` on the alert rules (syntax, PromQL, templates);
#   - `promtool test rules` on their unit tests (which alerts fire when, with which labels);
#   - every PromQL expression of the Grafana dashboard parsed by promtool too (written into
#     a throwaway rules file, Grafana's variables replaced by values).
# Installs promtool (Debian's `prometheus` package) when it is missing; does not start the
# Prometheus server. That the metric names exist is checked against a real scrape by
# tests/tests/deploy.rs (cargo test).
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v promtool >/dev/null 2>&1; then
  echo "promtool missing: installing Debian's prometheus package (the server is not started)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # policy-rc.d (where present) keeps the package's service from starting in a container.
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  # Where an init system started the server it came with, stop it: only promtool is wanted.
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
fi
promtool --version | head -1

promtool check rules prometheus/alerts.yml
# promtool resolves rule_files relative to the test file.
promtool test rules prometheus/alerts_test.yml

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
python3 - grafana/unimesh.json "$scratch/dashboard-rules.yml" <<'PY'
import json, re, sys

dashboard = json.load(open(sys.argv[1]))
exprs, ids = [], []

def walk(panels):
    for p in panels:
        ids.append(p["id"])
        for t in p.get("targets", []):
            exprs.append((p["title"], t["expr"]))
        walk(p.get("panels", []))

walk(dashboard["panels"])
if len(ids) != len(set(ids)):
    sys.exit("grafana/unimesh.json: panel ids are not unique")
for v in dashboard["templating"]["list"]:
    if v["type"] == "query":
        m = re.fullmatch(r"label_values\((.*), *\w+\)", v["query"]["query"])
        if not m:
            sys.exit(f"variable {v['name']}: not label_values(selector, label)")
        exprs.append((f"variable {v['name']}", m.group(1)))

def plain(expr):
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    return re.sub(r"\$\w+", ".*", expr)

rules = [{"record": f"dashboard:expr{i}", "expr": plain(e)} for i, (_, e) in enumerate(exprs)]
# JSON is YAML: promtool reads it as a rules file.
json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(sys.argv[2], "w"), indent=1)
print(f"grafana/unimesh.json: {len(ids)} panels, {len(exprs)} expressions")
PY
promtool check rules "$scratch/dashboard-rules.yml"
echo "deploy/: rules, rule tests and dashboard expressions are valid"
