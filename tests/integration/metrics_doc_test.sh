#!/usr/bin/env bash
# shellcheck disable=SC2016  # backquotes (Markdown) and $node (PromQL) are literal here
# docs/METRICS.md and the Grafana dashboard (deploy/grafana/dcr-relay.json)
# against the metrics a real dcr-relay serves, through tools/metrics-doc:
#   a. every family the relay serves is in the doc's table with its type
#      and label names, and the table has no other; every metric and label
#      the dashboard's queries name is served, counters through rate() or
#      increase()
#   b. the dashboard: JSON, panel ids unique, the datasource and node
#      variables, the panels an operator needs
#   c. the check catches drift, naming what differs: a family the doc
#      lacks, a row of a metric not served, a wrong type or labels, a row
#      not described, a family the sources name but the relay does not
#      serve, a dashboard query on an unknown metric or label or a raw
#      counter, two panels with one id, no datasource variable, not JSON
#   d. a metric added to the relay: --write adds its row (TODO), --check
#      fails until it is described, then passes
# Usage: metrics_doc_test.sh DCR_RELAY_BINARY SOURCE_DIR
set -euo pipefail
RELAY=$1
SRC=$2
T=$(mktemp -d /tmp/dcr-metrics-doc-test.XXXXXX)
trap 'rm -rf "$T"' EXIT
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

TOOL=(python3 "$SRC/tools/metrics-doc")
DOC=$SRC/docs/METRICS.md
DASH=$SRC/deploy/grafana/dcr-relay.json
[[ -f $DOC && -f $DASH ]] || fail "$DOC or $DASH is missing"

# has TEXT: the last command's stderr contains TEXT.
has() { grep -qF -- "$1" "$T/err" || { cat "$T/err" >&2; fail "the check did not say '$1'"; }; }

# --- a. The doc and the dashboard against a real relay ---------------------
expect 0 "${TOOL[@]}" --relay "$RELAY" --save-scrape "$T/scrape.txt"
grep -q "families served, all in" "$T/out" || { cat "$T/out" >&2; fail "no summary"; }
# The relay the tool starts serves the optional families too.
for f in dcr_relay_committed_step dcr_relay_serving_pause_seconds \
         dcr_relay_on_commit_runs_total dcr_relay_child_queue_bytes; do
  grep -q "^# TYPE $f " "$T/scrape.txt" || fail "the scrape lacks $f"
done
# Checks with this scrape (no relay needed); CHECK runs the tool on it.
CHECK=("${TOOL[@]}" --scrape "$T/scrape.txt")
expect 0 "${CHECK[@]}"

# --- b. The dashboard ------------------------------------------------------
python3 -S - "$DASH" <<'PY' || fail "dashboard checks failed"
import json, sys
d = json.load(open(sys.argv[1]))
def panels(ps):
    for p in ps or []:
        yield p
        yield from panels(p.get("panels"))
ps = list(panels(d["panels"]))
ids = [p["id"] for p in ps]
assert len(ids) == len(set(ids)), f"panel ids repeat: {ids}"
assert isinstance(d.get("schemaVersion"), int) and d["schemaVersion"] >= 36, d.get("schemaVersion")
assert d.get("uid") and d.get("title"), "no uid or title"
v = {x["name"]: x for x in d["templating"]["list"]}
assert v["datasource"]["type"] == "datasource" and v["datasource"]["query"] == "prometheus", v["datasource"]
q = v["node"]["query"]
q = q["query"] if isinstance(q, dict) else q
assert q.replace(" ", "") == "label_values(dcr_relay_committed_step,node)", q
assert v["node"]["includeAll"] and v["node"]["multi"], "the node variable must allow all and several"
exprs = " ".join(t["expr"] for p in ps for t in p.get("targets", []))
for p in ps:
    for t in p.get("targets", []):
        assert t["datasource"]["uid"] == "${datasource}", (p["title"], t["datasource"])
        assert 'node=~"$node"' in t["expr"], f"{p['title']}: {t['expr']} ignores $node"
# What an operator needs to see (issue: the relay dashboard).
for m in ["dcr_relay_committed_step", "dcr_relay_bytes_in_total", "dcr_relay_bytes_out_total",
          "dcr_relay_chunks_applied_total", "dcr_relay_chunks_forwarded_total",
          "dcr_relay_chunks_dropped_total", "dcr_relay_last_refit_duration_seconds",
          "dcr_relay_refits_total", "dcr_relay_repairs_total", "dcr_relay_child_queue_bytes",
          "dcr_relay_apply_backlog_bytes", "dcr_relay_memory_bytes", "dcr_relay_peers_cut_total",
          "dcr_relay_state", "dcr_relay_serving_pause_seconds"]:
    assert m in exprs, f"no panel queries {m}"
PY

# --- c. Drift is caught and named -----------------------------------------
doc_without() {  # doc_without SED_EXPR: a copy of the doc, edited, in $T/doc.md
  sed "$1" "$DOC" >"$T/doc.md"
  cmp -s "$DOC" "$T/doc.md" && fail "sed '$1' changed nothing in the doc"
  return 0
}
doc_without '/^| `dcr_relay_apply_backlog_bytes`/d'
expect 1 "${CHECK[@]}" --doc "$T/doc.md"
has "lacks dcr_relay_apply_backlog_bytes (gauge, labels node"
has "1 difference(s)"
doc_without 's/^| `dcr_relay_state` |/| `dcr_relay_bogus_total` | counter | `node` | x |\n&/'
expect 1 "${CHECK[@]}" --doc "$T/doc.md"
has "dcr_relay_bogus_total is listed but dcr-relay does not serve it"
doc_without 's/^| `dcr_relay_state` | gauge |/| `dcr_relay_state` | counter |/'
expect 1 "${CHECK[@]}" --doc "$T/doc.md"
has "dcr_relay_state is a gauge, the table says counter"
doc_without 's/^| `dcr_relay_child_queue_bytes` | gauge | `node`, `child` |/| `dcr_relay_child_queue_bytes` | gauge | `node` |/'
expect 1 "${CHECK[@]}" --doc "$T/doc.md"
has "dcr_relay_child_queue_bytes has labels node, child, the table says node"
doc_without 's/^\(| `dcr_relay_children` | gauge | `node`, `which` |\).*/\1 TODO: later |/'
expect 1 "${CHECK[@]}" --doc "$T/doc.md"
has "dcr_relay_children has no description"

# A metric name in the sources that the relay does not serve (behind an
# option the tool does not set).
mkdir -p "$T/src"
cp "$SRC/src/relay/relay_stats.cc" "$T/src/"
printf '%s\n' 'void X(MetricsText& m) { m.Family("dcr_relay_hidden_total", "counter", "x"); }' \
  >>"$T/src/relay_stats.cc"
expect 1 "${CHECK[@]}" --src "$T/src"
has "dcr_relay_hidden_total is not served by the relay tools/metrics-doc starts"

# Dashboards with one thing wrong.
dash() {  # dash PYTHON: a copy of the dashboard, d changed by PYTHON, in $T/dash.json
  python3 -S - "$DASH" "$T/dash.json" "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
def panels(ps):
    for p in ps or []:
        yield p
        yield from panels(p.get("panels"))
ps = [p for p in panels(d["panels"]) if p.get("targets")]
exec(sys.argv[3])
json.dump(d, open(sys.argv[2], "w"))
PY
}
dash 'ps[0]["targets"][0]["expr"] = "dcr_relay_nosuch_bytes{node=~\"$node\"}"'
expect 1 "${CHECK[@]}" --dashboard "$T/dash.json"
has "dcr_relay_nosuch_bytes is not a metric dcr-relay serves"
dash 'ps[0]["targets"][0]["expr"] = "sum by (node) (rate(dcr_relay_bytes_in_total{node=~\"$node\"}[$__rate_interval])) + sum(rate(dcr_relay_chunks_lost_total[5m]))"'
expect 1 "${CHECK[@]}" --dashboard "$T/dash.json"
has "dcr_relay_chunks_lost_total is not a metric dcr-relay serves"
dash 'ps[0]["targets"][0]["expr"] = "dcr_relay_committed_step{nodes=~\"$node\"}"'
expect 1 "${CHECK[@]}" --dashboard "$T/dash.json"
has "dcr_relay_committed_step has no label 'nodes'"
dash 'ps[0]["targets"][0]["expr"] = "sum by (child) (rate(dcr_relay_bytes_in_total{node=~\"$node\"}[5m]))"'
expect 1 "${CHECK[@]}" --dashboard "$T/dash.json"
has "has a label 'child'"
dash 'ps[0]["targets"][0]["legendFormat"] = "{{peer}}"'
expect 1 "${CHECK[@]}" --dashboard "$T/dash.json"
has "has a label 'peer'"
dash 'ps[0]["targets"][0]["expr"] = "dcr_relay_bytes_in_total{node=~\"$node\"}"'
expect 1 "${CHECK[@]}" --dashboard "$T/dash.json"
has "the counter dcr_relay_bytes_in_total is read without rate()"
dash 'ps[0]["targets"][0]["expr"] = "rat(dcr_relay_bytes_in_total{node=~\"$node\"}[5m])"'
expect 1 "${CHECK[@]}" --dashboard "$T/dash.json"
has "rat() is not a PromQL function"
dash 'ps[1]["id"] = ps[0]["id"]'
expect 1 "${CHECK[@]}" --dashboard "$T/dash.json"
has "is also panel"
dash 'd["templating"]["list"] = [v for v in d["templating"]["list"] if v["type"] != "datasource"]'
expect 1 "${CHECK[@]}" --dashboard "$T/dash.json"
has "no Prometheus datasource variable"
dash 'ps[0]["datasource"] = {"type": "prometheus", "uid": "P1809F7CD0C75ACF3"}'
expect 1 "${CHECK[@]}" --dashboard "$T/dash.json"
has "is not the datasource variable"
dash 'd["templating"]["list"][1]["query"]["query"] = "label_values(dcr_relay_committed_step, host)"'
expect 1 "${CHECK[@]}" --dashboard "$T/dash.json"
has "has a label 'host'"
echo '{"panels": [' >"$T/dash.json"
expect 1 "${CHECK[@]}" --dashboard "$T/dash.json"
has "not a JSON dashboard"

# --- d. A metric added to the relay ---------------------------------------
cp "$T/scrape.txt" "$T/scrape2.txt"
printf '%s\n' '# HELP dcr_relay_applied_bytes_total Bytes applied to the store' \
  '# TYPE dcr_relay_applied_bytes_total counter' \
  'dcr_relay_applied_bytes_total{node="m0"} 0' >>"$T/scrape2.txt"
cp "$DOC" "$T/doc.md"
expect 1 "${TOOL[@]}" --scrape "$T/scrape2.txt" --doc "$T/doc.md"
has "lacks dcr_relay_applied_bytes_total (counter, labels node: \"Bytes applied to the store\")"
expect 1 "${TOOL[@]}" --scrape "$T/scrape2.txt" --doc "$T/doc.md" --write
grep -q "added dcr_relay_applied_bytes_total" "$T/out" || { cat "$T/out" >&2; fail "--write did not say what it added"; }
has "dcr_relay_applied_bytes_total has no description"
grep -q '^| `dcr_relay_applied_bytes_total` | counter | `node` | TODO: Bytes applied to the store |$' \
  "$T/doc.md" || fail "--write did not add the row"
sed -i 's/TODO: Bytes applied to the store/How far the refit is along./' "$T/doc.md"
expect 0 "${TOOL[@]}" --scrape "$T/scrape2.txt" --doc "$T/doc.md"
# --write changed nothing else: the rest of the doc is as it was.
diff <(grep -v dcr_relay_applied_bytes_total "$T/doc.md") "$DOC" >/dev/null ||
  fail "--write changed more than the new row"
# A metric gone from the relay: --write drops its row.
expect 0 "${TOOL[@]}" --scrape "$T/scrape.txt" --doc "$T/doc.md" --write
grep -q "removed dcr_relay_applied_bytes_total" "$T/out" || fail "--write did not drop the row"
cmp -s "$T/doc.md" "$DOC" || fail "--write of the served metrics changes docs/METRICS.md: run tools/metrics-doc --write"

echo "metrics_doc: OK"
