#!/usr/bin/env bash
# `dcr tree` and `dcr topo` as a user runs them: every shipped topology
# validates, renders as text, DOT and JSON; edits rewrite the file only
# when the result is valid, and an invalid edit leaves it byte-identical.
# Usage: topo_cli_test.sh DCR_BINARY TOPOLOGY_DIR
set -euo pipefail
DCR=$1
TOPO=$2
T=$(mktemp -d /tmp/dcr-topo-test.XXXXXX)
trap 'rm -rf "$T"' EXIT
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

json() { python3 -c "import json,sys; d=json.load(open('$T/out')); assert $1, d"; }

# Help: every subcommand has an example.
for sub in "tree" "topo" "topo validate" "topo show" "topo add-node" \
           "topo remove-node" "topo set"; do
  # shellcheck disable=SC2086
  expect 0 "$DCR" $sub --help
  grep -q "Example" "$T/out" || fail "$sub --help lacks an example"
done
expect 0 "$DCR" topo set --help
grep -q "Comments" "$T/out" || fail "topo set --help does not say comments are lost"
expect 2 "$DCR" topo
expect 2 "$DCR" tree
expect 2 "$DCR" tree --topology "$TOPO/local.yaml" --format svg

# Every shipped topology validates and renders.
for f in "$TOPO"/*.yaml; do
  expect 0 "$DCR" topo validate "$f"
  grep -q "valid" "$T/out" || fail "validate $f"
  expect 0 "$DCR" topo validate "$f" -o json
  json 'd["valid"] and d["summary"]["relays"] > 0'
  expect 0 "$DCR" tree --topology "$f"
  expect 0 "$DCR" tree --topology "$f" -o json
  json 'd["nodes"][0]["parent"] == -1 and all(n["parent"] >= 0 for n in d["nodes"][1:])'
  expect 0 "$DCR" tree --topology "$f" --format dot
  grep -q "subgraph \"cluster_" "$T/out" || fail "dot output of $f"
  if command -v dot >/dev/null; then dot -Tsvg "$T/out" -o "$T/tree.svg" || fail "graphviz rejects $f"; fi
  expect 0 "$DCR" topo show "$f"
  cp "$T/out" "$T/shown.yaml"
  expect 0 "$DCR" topo validate "$T/shown.yaml"   # show's output reloads
  expect 0 "$DCR" topo show "$f" -o json
  json '"topology" in d and "summary" in d'
done

# local.yaml: 8 relays under ${DCR_LOCAL_DIR}, root feeds 2 heads.
DCR_LOCAL_DIR=$T/local expect 0 "$DCR" tree --topology "$TOPO/local.yaml" -o json
json 'len(d["nodes"]) == 9 and len(d["nodes"][0]["children"]) == 2'
json 'all(n["store"]["path"].startswith("'"$T"'/local/") for n in d["nodes"][1:])'

# Edits on a copy.
F=$T/t.yaml
cp "$TOPO/two-region.yaml" "$F"
expect 0 "$DCR" topo set "$F" clusters.rollout-a.fanout=1 'links[0].bandwidth=1Gbps'
expect 0 "$DCR" tree --topology "$F" -o json
json '[n["name"] for n in d["nodes"] if n["cluster"]=="rollout-a" and n["fanout"]==1]'
expect 0 "$DCR" topo add-node "$F" --cluster rollout-b --name b4 --host 10.2.0.14 \
  --port 17001 --store shm:/dcr-policy --metrics-port 9101
expect 0 "$DCR" topo show "$F" -o json
json 'any(n["name"]=="b4" for c in d["topology"]["clusters"] for n in c["nodes"])'
expect 0 "$DCR" topo remove-node "$F" --name b4
expect 0 "$DCR" topo validate "$F"

# Invalid edits: exit 2, one-line error, file byte-identical.
cp "$F" "$T/before.yaml"
same() { cmp -s "$F" "$T/before.yaml" || fail "file changed by a refused edit: $1"; }
expect 2 "$DCR" topo set "$F" nodes.a0.port=abc
expect_err "nodes.a0.port: expected an integer 1-65535, got 'abc'"; same port
expect 2 "$DCR" topo set "$F" nodes.a1.host=10.1.0.10
expect_err "already used by node 'a0'"; same dup
expect 2 "$DCR" topo set "$F" 'links[0].to=nowhere'
expect_err "unknown cluster 'nowhere'"; same link
expect 2 "$DCR" topo set "$F" clusters.rollout-a.fanout=2 nodes.a0.prot=1
expect_err "did you mean 'port'"; same partial
expect 2 "$DCR" topo set "$F" novalue
expect_err "expected KEY=VALUE"; same novalue
expect 2 "$DCR" topo add-node "$F" --cluster rollout-a --name a0 --host 10.9.9.9 --port 1
expect_err "duplicate node name 'a0'"; same add
expect 2 "$DCR" topo add-node "$F" --cluster nope --name z --host h --port 1
expect_err "no cluster named 'nope'"; same add-cluster
expect 2 "$DCR" topo add-node "$F" --cluster rollout-a --name z --host h --port 1 --store tape:/x
expect_err "--store"; same store
expect 2 "$DCR" topo remove-node "$F" --name nope
expect_err "no node named 'nope'"; same remove
[[ ! -e "$F.tmp" ]] || fail "temp file left behind"

# Broken files: file:line: key, exit 2.
sed 's/port: 17000/port: seventeen/' "$TOPO/two-region.yaml" >"$T/bad.yaml"
expect 2 "$DCR" topo validate "$T/bad.yaml"
expect_err "bad.yaml:18: root.port: expected an integer 1-65535, got 'seventeen'"
expect 2 "$DCR" tree --topology "$T/bad.yaml"
expect_err "bad.yaml:18: root.port"
expect 2 "$DCR" topo validate "$T/bad.yaml" -o json
json 'not d["valid"] and "root.port" in d["error"]'
expect 2 "$DCR" topo validate "$T/missing.yaml"
expect_err "missing.yaml"
cp "$T/bad.yaml" "$T/bad-before.yaml"
expect 2 "$DCR" topo set "$T/bad.yaml" root.port=17000
cmp -s "$T/bad.yaml" "$T/bad-before.yaml" || fail "an invalid file was rewritten"
# dcr plan: the projection SCALE.md shows, text and JSON, and bad inputs.
expect 0 "$DCR" plan --help
grep -q "commit column" "$T/out" || fail "plan --help does not explain the commit column"
expect 0 "$DCR" plan --topology "$TOPO/two-region.yaml" --params 1T \
  --change-rate 3% --wan 3.048Gbps --lan 100Gbps
grep -q "commit" "$T/out" || fail "plan prints no commit column"
grep -q "delta refit predicted" "$T/out" || fail "plan prints no speedup"
expect 0 "$DCR" plan --topology "$TOPO/two-region.yaml" --params 1T \
  --change-rate 3% --wan 3.048Gbps --lan 100Gbps -o json
json 'd["receivers"] == 8 and d["speedup"] > 10 and d["delta"]["baseline_s"] > 0 and d["delta"]["commit_s"] == 0 and d["full"]["commit_s"] >= d["full"]["baseline_s"] and abs(d["delta"]["total_s"] - sum(d["delta"][k] for k in ("prepare_s", "control_s", "stream_s", "verify_s", "commit_s"))) < 1e-6 * d["delta"]["total_s"]'
# A calibration that names its own rates changes the prediction.
echo '{"baseline_rate": 1.5e9, "note": "half as fast"}' >"$T/cal.json"
cp "$T/out" "$T/plan-builtin.json"
expect 0 "$DCR" plan --topology "$TOPO/two-region.yaml" --params 1T \
  --change-rate 3% --wan 3.048Gbps --lan 100Gbps -o json --calibration "$T/cal.json"
python3 -c "import json; a=json.load(open('$T/plan-builtin.json')); b=json.load(open('$T/out')); assert abs(b['delta']['baseline_s'] - 2 * a['delta']['baseline_s']) < 1e-6, (a, b)"
# A producers' refit: the root's diff, hash of the target and baseline pass
# are gone from the encode stage (the ranks' diff; the root's apply of
# their parts and its coding of the changed spans in context), and the
# payload is the canonical refit's context-coded one.
expect 0 "$DCR" plan --topology "$TOPO/two-region.yaml" --params 1T \
  --change-rate 3% --wan 3.048Gbps --lan 100Gbps -o json --producers 64
python3 -c "import json; a=json.load(open('$T/plan-builtin.json')); b=json.load(open('$T/out')); d=b['delta']; assert b['producers'] == 64 and b['producer_cores'] == 4 and 0 < d['producers_s'] <= d['encode_s'] < a['delta']['encode_s'] and d['recode_s'] > 0 and abs(d['encode_s'] - max(d['producers_s'], d['baseline_s'] + d['recode_s'])) < 1e-9 * d['encode_s'] and d['payload_bytes'] == a['delta']['payload_bytes'], (a['delta'], d)"
# Without context: base-independent parts, nothing coded again at the root.
expect 0 "$DCR" plan --topology "$TOPO/two-region.yaml" --params 1T \
  --change-rate 3% --wan 3.048Gbps --lan 100Gbps -o json --producers 64 --no-context
python3 -c "import json; a=json.load(open('$T/plan-builtin.json')); b=json.load(open('$T/out')); d=b['delta']; assert d['recode_s'] == 0 and d['encode_s'] < a['delta']['encode_s'] / 4 and d['payload_bytes'] > a['delta']['payload_bytes'], (a['delta'], d)"
expect 0 "$DCR" plan --topology "$TOPO/two-region.yaml" --params 1T \
  --change-rate 3% --wan 3.048Gbps --producers 64 --producer-cores 8
grep -q "delta from 64 producers x 8 cores" "$T/out" || fail "plan --producers text"
# Serving ranks below s0 keep its subtree off context coding, as dcr refit
# does: the delta row is the mixed tree (a0's subtree context-coded, s0's
# base-independent), so it carries the larger base-independent frame and
# the context encoder.
expect 0 "$DCR" plan --topology "$TOPO/serve-local.yaml" --params 1B \
  --change-rate 3%
grep -q "base-independent chunks for the subtrees of s0 (serving ranks below: they hold parts of spans); context-coded for a0" "$T/out" ||
  fail "plan does not name the serving subtree"
expect 0 "$DCR" plan --topology "$TOPO/serve-local.yaml" --params 1B \
  --change-rate 3% -o json
json 'd["context_subtrees"] == ["a0"] and d["base_independent_subtrees"] == ["s0"]'
cp "$T/out" "$T/plan-serve.json"
expect 0 "$DCR" plan --topology "$TOPO/serve-local.yaml" --params 1B \
  --change-rate 3% -o json --no-context
json 'd["context_subtrees"] == [] and d["base_independent_subtrees"] == ["a0", "s0"]'
python3 -c "import json; m=json.load(open('$T/plan-serve.json'))['delta']; p=json.load(open('$T/out'))['delta']; assert m['payload_bytes'] == p['payload_bytes'] and m['encode_s'] > p['encode_s'], (m, p)"
# A calibration measures the (context-coded) refit it ran: the serving
# subtree keeps the built-in base-independent payload.
echo '{"payload_ratio": [[0.01, 1e-5], [0.05, 1e-5]]}' >"$T/tiny.json"
expect 0 "$DCR" plan --topology "$TOPO/serve-local.yaml" --params 1B \
  --change-rate 3% -o json --calibration "$T/tiny.json"
python3 -c "import json; m=json.load(open('$T/plan-serve.json'))['delta']; c=json.load(open('$T/out'))['delta']; assert c['payload_bytes'] == m['payload_bytes'], (m, c)"
expect 0 "$DCR" plan --topology "$TOPO/two-region.yaml" --params 1T \
  --change-rate 3% -o json
json 'd["context_subtrees"] == ["a0", "b0"] and d["base_independent_subtrees"] == []'
expect 0 "$DCR" plan --topology "$TOPO/two-region.yaml" --params 1T \
  --change-rate 3%
if grep -q "serving ranks below" "$T/out"; then fail "plan names serving subtrees where there are none"; fi
expect 2 "$DCR" plan --topology "$TOPO/two-region.yaml" --params 1T --change-rate 150%
expect_err "--change-rate '150%'"
echo '{"baseline_rte": 1e9}' >"$T/badcal.json"
expect 2 "$DCR" plan --topology "$TOPO/two-region.yaml" --params 1T \
  --change-rate 3% --calibration "$T/badcal.json"
expect_err "unknown field 'baseline_rte'"
echo "topo CLI: ok"
