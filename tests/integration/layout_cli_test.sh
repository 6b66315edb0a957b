#!/usr/bin/env bash
# `dcr layout check` and `dcr layout verify` as a user runs them: every
# shipped layout validates, in text and JSON, with per-rank figures that add
# up to the model; a rank's listing names its shards; a broken layout fails
# with exit code 2 and the file, line, tensor and ranks in the message.
# `dcr-traingen --layout` writes each version as every rank's shards, which
# verify against that version's canonical file and no other, and a
# corrupted or reshaped shard is caught. `dcr diff --layout` builds a delta
# from the ranks' shards alone that `dcr apply` takes from the canonical
# base to the canonical target, naming both as the canonical diff does.
# Usage: layout_cli_test.sh DCR_BINARY LAYOUTS_DIR TRAINGEN_BINARY
set -euo pipefail
DCR=$1
LAYOUTS=$2
TRAINGEN=$3
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
# A tiny model under the shipped traingen layout's scheme (tp 2, pp 2).
sed -e 's/32000/300/g; s/1024/64/g; s/2752/192/g; s/layers: 8/layers: 4/' \
  -e 's/heads: 16/heads: 4/; s/kv_heads: 4/kv_heads: 2/; s/head_dim: 64/head_dim: 16/' \
  "$f" >"$T/tiny.yaml"
expect 0 "$DCR" layout check "$T/tiny.yaml"
expect 2 "$TRAINGEN" --hidden 64 --layers 2 --heads 4 --kv-heads 2 --vocab 300 \
  --steps 1 --out "$T/ckpt" --layout "$T/tiny.yaml"
grep -q "layout $T/tiny.yaml places tensor 'model.layers.2" "$T/err" ||
  fail "a layout of another model: $(cat "$T/err")"
expect 0 "$TRAINGEN" --hidden 64 --layers 4 --heads 4 --kv-heads 2 --vocab 300 \
  --steps 2 --out "$T/ckpt" --layout "$T/tiny.yaml"
for k in 0 1 2; do
  [[ $(find "$T/ckpt/v$k.shards" -name 'rank-*.safetensors' | wc -l) -eq 4 ]] ||
    fail "v$k: 4 rank files"
  expect 0 "$DCR" layout verify "$T/tiny.yaml" --shards "$T/ckpt/v$k.shards" \
    --canonical "$T/ckpt/v$k.safetensors"
  grep -q "^identical" "$T/out" || fail "v$k shards"
done
expect 1 "$DCR" layout verify "$T/tiny.yaml" --shards "$T/ckpt/v1.shards" \
  --canonical "$T/ckpt/v2.safetensors" -o json
json 'not d["identical"] and d["differing_elements"] > 0 and len(d["ranks"]) == 4'
# Flip one bit of rank 3's first MLP down-projection element.
cp -r "$T/ckpt/v1.shards" "$T/bad"
python3 - "$T/bad/rank-00003.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
start = json.loads(b[8:8 + n])["decoder.layers.0.mlp.linear_fc2.weight"]["data_offsets"][0]
b[8 + n + start] ^= 0x01
open(p, "wb").write(bytes(b))
PY
expect 1 "$DCR" layout verify "$T/tiny.yaml" --shards "$T/bad" \
  --canonical "$T/ckpt/v1.safetensors" --rank 3
grep -q "^rank 3 shard 'decoder.layers.0.mlp.linear_fc2.weight' element 0 holds 0x.*, but 'model.layers.2.mlp.down_proj.weight' element 96 is 0x.* (1 elements of the shard differ)" "$T/out" ||
  fail "flipped bit: $(cat "$T/out")"
expect 0 "$DCR" layout verify "$T/tiny.yaml" --shards "$T/bad" \
  --canonical "$T/ckpt/v1.safetensors" --rank 2
# The same shards under tp 1 x pp 4: shapes disagree, named with the file.
sed 's/tp: 2, pp: 2/tp: 1, pp: 4/' "$T/tiny.yaml" >"$T/pp4.yaml"
expect 2 "$DCR" layout verify "$T/pp4.yaml" --shards "$T/ckpt/v1.shards" \
  --canonical "$T/ckpt/v1.safetensors"
grep -q "rank-00000.safetensors: tensor '.*' is BF16 \[.*\], but layout .*pp4.yaml says BF16" "$T/err" ||
  fail "reshaped shards: $(cat "$T/err")"
# A delta from the ranks' shards: the same versions as the canonical diff,
# and applied to the gathered base it gives the gathered target.
expect 0 "$DCR" diff --layout "$T/tiny.yaml" --base-shards "$T/ckpt/v0.shards" \
  --target-shards "$T/ckpt/v1.shards" -o "$T/shards.dcr" --format json
json 'd["producers"] == 4 and d["chunks"] > 0 and d["changed_elements"] > 0'
python3 -c "import json; json.dump(json.load(open('$T/out')), open('$T/shards.json', 'w'))"
expect 0 "$DCR" diff "$T/ckpt/v0.safetensors" "$T/ckpt/v1.safetensors" \
  -o "$T/canon.dcr" --format json
python3 - "$T/shards.json" "$T/out" <<'PY'
import json, sys
s, c = (json.load(open(p)) for p in sys.argv[1:])
for k in ("base", "target", "tensors", "changed_elements"):
    assert s[k] == c[k], (k, s[k], c[k])
PY
cp "$T/ckpt/v0.safetensors" "$T/work.safetensors"
expect 0 "$DCR" apply "$T/shards.dcr" "$T/work.safetensors"
expect 0 "$DCR" verify "$T/work.safetensors" "$T/ckpt/v1.safetensors"
expect 0 "$DCR" inspect "$T/shards.dcr"
# Steps come from the shard files' dcr.step, as the canonical diff's do.
expect 0 "$DCR" diff --layout "$T/tiny.yaml" --base-shards "$T/ckpt/v1.shards" \
  --target-shards "$T/ckpt/v2.shards" -o "$T/v2.dcr" --format json
json 'd["base"]["step"] == 1 and d["target"]["step"] == 2'

# Mixed or missing inputs are usage errors; a missing rank is named.
expect 2 "$DCR" diff --layout "$T/tiny.yaml" "$T/ckpt/v0.safetensors" \
  --base-shards "$T/ckpt/v0.shards" --target-shards "$T/ckpt/v1.shards" -o "$T/x.dcr"
grep -q "instead of BASE and TARGET" "$T/err" || fail "mixed diff inputs"
expect 2 "$DCR" diff --base-shards "$T/ckpt/v0.shards" -o "$T/x.dcr"
grep -q "give BASE and TARGET" "$T/err" || fail "shards without a layout"
mkdir "$T/three"
cp "$T/ckpt/v1.shards"/rank-0000[012].safetensors "$T/three/"
expect 2 "$DCR" diff --layout "$T/tiny.yaml" --base-shards "$T/ckpt/v0.shards" \
  --target-shards "$T/three" -o "$T/x.dcr"
grep -q "rank-00003.safetensors' does not exist" "$T/err" || fail "missing rank: $(cat "$T/err")"
[[ ! -e "$T/x.dcr" ]] || fail "a failed diff left a delta"

# A serving layout (vLLM names, stacked qkv, tp 2): read --serving, every
# rank also holds the replicated norms, so the ranks hold more than the
# model; as a producer layout each element has one owner.
s="$LAYOUTS/traingen-serve-tp2.yaml"
expect 0 "$DCR" layout check "$s" --serving -o json
json 'd["valid"] and all(r["held_elements"] > d["elements"] / 2 for r in d["per_rank"])'
json 'sum(r["held_elements"] for r in d["per_rank"]) > d["elements"]'
expect 0 "$DCR" layout check "$s" --serving --rank 1
grep -q "model.norm.weight BF16 \[1024\]" "$T/out" || fail "rank 1 lacks its norm copy"
grep -q "model.layers.0.self_attn.qkv_proj.weight BF16 \[768, 1024\]" "$T/out" ||
  fail "rank 1's stacked qkv"
expect 0 "$DCR" layout check "$s" --rank 1
! grep -q "model.norm.weight" "$T/out" || fail "a producer rank 1 holds the norm"
# A tiny model under it, written as a server's ranks hold it; a flipped bit
# in rank 1's copy of a norm is seen only when the copies are compared.
sed -e 's/32000/300/g; s/1024/64/g; s/2752/192/g; s/layers: 8/layers: 2/' \
  -e 's/heads: 16/heads: 4/; s/kv_heads: 4/kv_heads: 2/; s/head_dim: 64/head_dim: 16/' \
  -e 's/pad_to: 32/pad_to: 2/' "$s" >"$T/serve.yaml"
expect 2 "$TRAINGEN" --steps 1 --out "$T/sv" --serving
grep -q "serving reads --layout" "$T/err" || fail "--serving without --layout"
expect 0 "$TRAINGEN" --hidden 64 --layers 2 --heads 4 --kv-heads 2 --vocab 300 \
  --steps 1 --out "$T/sv" --layout "$T/serve.yaml" --serving
expect 0 "$DCR" layout verify "$T/serve.yaml" --serving --shards "$T/sv/v1.shards" \
  --canonical "$T/sv/v1.safetensors"
grep -q "^identical" "$T/out" || fail "serving shards"
python3 - "$T/sv/v1.shards/rank-00001.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
start = json.loads(b[8:8 + n])["model.norm.weight"]["data_offsets"][0]
b[8 + n + start] ^= 0x01
open(p, "wb").write(bytes(b))
PY
expect 1 "$DCR" layout verify "$T/serve.yaml" --serving --shards "$T/sv/v1.shards" \
  --canonical "$T/sv/v1.safetensors"
grep -q "^rank 1 shard 'model.norm.weight' element 0" "$T/out" ||
  fail "a flipped copy: $(cat "$T/out")"
expect 0 "$DCR" layout verify "$T/serve.yaml" --shards "$T/sv/v1.shards" \
  --canonical "$T/sv/v1.safetensors"

# The same server with its attention and MLP weights in FP8: each rank's
# file holds the E4M3 codes, the block scales and the BF16 shadows; a code
# or a shadow bit flipped is caught.
python3 - "$T/serve.yaml" "$T/fp8.yaml" <<'PY'
import sys
out = []
for line in open(sys.argv[1]):
    out.append(line)
    if "order: stacked" in line:
        out.append("    fp8: {block: [16, 32]}\n")
    if "split: gate_up" in line:
        out.append("    fp8: {block: [32, 32]}\n")
open(sys.argv[2], "w").write("".join(out))
PY
expect 0 "$TRAINGEN" --hidden 64 --layers 2 --heads 4 --kv-heads 2 --vocab 300 \
  --steps 1 --out "$T/f8" --layout "$T/fp8.yaml" --serving
expect 0 "$DCR" layout verify "$T/fp8.yaml" --serving --shards "$T/f8/v1.shards" \
  --canonical "$T/f8/v1.safetensors" -o json
json 'd["identical"] and len(d["ranks"]) == 2'
python3 - "$T/f8/v1.shards/rank-00000.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
g = "model.layers.1.mlp.gate_up_proj.weight"
assert h[g]["dtype"] == "F8_E4M3" and h[g + "_scale_inv"]["dtype"] == "F32", h[g]
b[8 + n + h[g]["data_offsets"][0] + 7] ^= 0x01
open(p, "wb").write(bytes(b))
PY
expect 1 "$DCR" layout verify "$T/fp8.yaml" --serving --shards "$T/f8/v1.shards" \
  --canonical "$T/f8/v1.safetensors" --rank 0
grep -q "^rank 0 shard 'model.layers.1.mlp.gate_up_proj.weight' element 7 .* as quantized from the canonical tensors" "$T/out" ||
  fail "a flipped FP8 code: $(cat "$T/out")"
expect 2 "$DCR" layout verify "$T/fp8.yaml" --shards "$T/f8/v1.shards" \
  --canonical "$T/f8/v1.safetensors"
grep -q "as FP8: that is a serving layout" "$T/err" || fail "fp8 without --serving"
echo "layout_cli: ok"
