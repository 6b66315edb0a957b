#!/usr/bin/env bash
# `dcr layout check` as a user runs it: every shipped layout validates, in
# text and JSON, with per-rank figures that add up to the model; a rank's
# listing names its shards; a broken layout fails with exit code 2 and the
# file, line, tensor and ranks in the message.
# Usage: layout_cli_test.sh DCR_BINARY LAYOUTS_DIR
set -euo pipefail
DCR=$1
LAYOUTS=$2
T=$(mktemp -d /tmp/dcr-layout-test.XXXXXX)
trap 'rm -rf "$T"' EXIT
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

json() { python3 -c "import json,sys; d=json.load(open('$T/out')); assert $1, d"; }

expect 0 "$DCR" layout check --help
grep -q "Example" "$T/out" || fail "layout check --help lacks an example"
expect 2 "$DCR" layout
expect 2 "$DCR" layout check

for f in "$LAYOUTS"/*.yaml; do
  expect 0 "$DCR" layout check "$f"
  grep -q "valid: " "$T/out" || fail "check $f"
  expect 0 "$DCR" layout check "$f" -o json
  # Every canonical element is produced by exactly one rank.
  json 'd["valid"] and sum(r["produced_elements"] for r in d["per_rank"]) == d["elements"]'
  json 'len(d["per_rank"]) == d["ranks"] == d["tp"] * d["pp"] * d["ep"]'
done

f="$LAYOUTS/traingen-tp2-pp2.yaml"
expect 0 "$DCR" layout check "$f" --rank 3 -o json
json 'd["rank"] == 3 and any(s["name"] == "output_layer.weight" for s in d["shards"])'
json 'all(s["name"].startswith(("decoder", "output")) for s in d["shards"])'
expect 0 "$DCR" layout check "$f" --rank 1
grep -q "embedding.word_embeddings.weight BF16 \[16000, 1024\]" "$T/out" ||
  fail "rank 1's vocabulary shard"
expect 2 "$DCR" layout check "$f" --rank 4
grep -q "the layout has ranks 0-3" "$T/err" || fail "--rank out of range"

# tp 3 does not divide 4 kv head groups (the vocabulary pads): the line,
# the entry and the tensor.
sed 's/tp: 2, pp: 2/tp: 3, pp: 2/' "$f" >"$T/bad.yaml"
expect 2 "$DCR" layout check "$T/bad.yaml"
grep -qF "bad.yaml:18: tensors[2]: tensor 'model.layers.0.self_attn.q_proj.weight': 4 kv_heads do not split evenly over tp 3" "$T/err" ||
  fail "tp 3 is not refused with its line: $(cat "$T/err")"
expect 2 "$DCR" layout check "$T/bad.yaml" -o json
json 'not d["valid"] and "tp 3" in d["error"]'

# Two entries claiming the same canonical tensor.
cat "$f" >"$T/dup.yaml"
cat >>"$T/dup.yaml" <<'YAML'
  - name: model.norm.weight
    shard: extra
    split: replicated
    shape: [1024]
YAML
expect 2 "$DCR" layout check "$T/dup.yaml"
grep -q "dup.yaml:[0-9]*: tensors\[9\]: tensor 'model.norm.weight': already declared by tensors\[7\]" "$T/err" ||
  fail "duplicate tensor: $(cat "$T/err")"
expect 2 "$DCR" layout check "$T/missing.yaml"
grep -q "does not exist" "$T/err" || fail "missing file"
echo "layout_cli: ok"
