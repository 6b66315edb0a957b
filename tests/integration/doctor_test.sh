#!/usr/bin/env bash
# `dcr doctor` and `dcr-relay --doctor` as a user runs them: the report as a
# table and as JSON, the same facts from both binaries, and with a topology
# the exit code: 0 when every transport it needs is usable here, 6 when
# not (a topology on UCX: 6 unless the JSON says UCX is usable here; TLS
# files that do not load: 6).
# Usage: doctor_test.sh DCR_BINARY DCR_RELAY_BINARY TOPOLOGY_DIR
set -euo pipefail
DCR=$1
RELAY=$2
TOPO=$3
T=$(mktemp -d /tmp/dcr-doctor-test.XXXXXX)
trap 'rm -rf "$T"' EXIT
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

# Help: an example and the exit codes.
expect 0 "$DCR" doctor --help
grep -q "Example" "$T/out" || fail "doctor --help lacks an example"
grep -q "6 with --topology" "$T/out" || fail "doctor --help lacks exit code 6"
expect 0 "$DCR" --help
grep -q "6  doctor" "$T/out" || fail "dcr --help lacks exit code 6"
expect 0 "$RELAY" --help
grep -q -- "--doctor" "$T/out" || fail "dcr-relay --help lacks --doctor"

# The table.
expect 0 "$DCR" doctor
for row in "^TRANSPORT +BUILT +USABLE +VERSION +DETAIL" "^tcp +yes +yes " "^ucx +(yes|no) +(yes|no) " \
           "^TLS +built: OpenSSL" "^CUDA +(built|not built)" \
           "^CPU +digest kernel [a-z0-9/]+.*, context scan [a-z0-9]+$"; do
  grep -qE "$row" "$T/out" || { cat "$T/out" >&2; fail "dcr doctor lacks a line like '$row'"; }
done
grep -q "topology" "$T/out" && fail "dcr doctor without --topology reports a topology"

# The JSON: the same facts.
expect 0 "$DCR" doctor -o json
cp "$T/out" "$T/dcr.json"
json 'list(d) == ["build", "transports", "tls", "cuda", "cpu", "topology", "ready"]' \
  'd["cpu"]["digest_kernel"] in ("generic", "pclmul", "vpclmulqdq/avx2", "vpclmulqdq")' \
  'd["cpu"]["context_scan"] in ("generic", "avx2", "avx512", "avx512vbmi2")' \
  '[t["kind"] for t in d["transports"]] == ["tcp", "ucx"]' \
  'all(set(t) == {"kind", "built", "usable", "version", "detail"} for t in d["transports"])' \
  'd["transports"][0]["built"] and d["transports"][0]["usable"]' \
  'd["tls"]["built"] and d["tls"]["library"].startswith("OpenSSL") and not d["tls"]["needed"]' \
  'd["cuda"]["built"] == (d["build"]["options"]["DCR_CUDA"] != "OFF" and d["build"]["cuda_compiler_found"])' \
  'd["build"]["version"] != "unknown"' \
  'set(d["cuda"]) == {"built", "gpu_present", "driver_version", "runtime_version", "devices", "detail"}' \
  'd["topology"] is None and d["ready"] is True'
if [[ -e /dev/nvidia0 ]] || nvidia-smi -L >/dev/null 2>&1; then
  json 'd["cuda"]["gpu_present"] is True'
else
  json 'd["cuda"]["gpu_present"] is False and "no GPU found" in d["cuda"]["detail"]' \
    'd["cuda"]["devices"] == []' \
    'not d["cuda"]["built"] or "no usable CUDA device" in d["cuda"]["detail"]'
fi
UCX_USABLE=$(python3 -S -c "import json; print(int(json.load(open('$T/dcr.json'))['transports'][1]['usable']))")

# dcr-relay --doctor: the same report, and it starts no relay.
expect 0 "$RELAY" --doctor -o json
python3 -S - "$T/dcr.json" "$T/out" <<'PY' || fail "dcr doctor and dcr-relay --doctor disagree"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
sys.exit(0 if a == b else 1)
PY
expect 0 "$RELAY" --doctor
grep -qE "^tcp +yes +yes " "$T/out" || fail "dcr-relay --doctor prints no table"

# A topology on TCP: ready; every relay needs tcp (the root's view), or a0
# and the nodes below it (--node).
expect 0 "$DCR" doctor --topology "$TOPO/local.yaml" -o json
json 'd["ready"] and d["topology"]["file"].endswith("local.yaml") and d["topology"]["node"] is None' \
  '[n["transport"] for n in d["topology"]["needs"]] == ["tcp"]' \
  'sorted(d["topology"]["needs"][0]["nodes"]) == ["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"]'
expect 0 "$DCR" doctor --topology "$TOPO/local.yaml"
grep -q "^ready: " "$T/out" || fail "no ready line"
expect 0 "$RELAY" --doctor --topology "$TOPO/local.yaml" --node a0 -o json
json 'd["ready"] and d["topology"]["node"] == "a0"' \
  'd["topology"]["needs"][0]["nodes"][0] == "a0" and not any(n.startswith("b") for n in d["topology"]["needs"][0]["nodes"])'
expect 2 "$RELAY" --doctor --topology "$TOPO/local.yaml" --node nope
expect_err "no relay named 'nope'"
expect 2 "$DCR" doctor --topology "$T/missing.yaml"
expect 2 "$DCR" doctor --node a0

# A topology on UCX: the exit code follows whether UCX is usable here.
sed 's/^  transport: tcp$/  transport: ucx/' "$TOPO/local.yaml" >"$T/ucx.yaml"
grep -q "^  transport: ucx$" "$T/ucx.yaml" || fail "could not make a UCX topology"
if [[ $UCX_USABLE == 1 ]]; then want=0; else want=6; fi
expect "$want" "$DCR" doctor --topology "$T/ucx.yaml" -o json
json '[n["transport"] for n in d["topology"]["needs"]] == ["ucx"]' \
  "d['ready'] == bool($UCX_USABLE) and d['topology']['needs'][0]['usable'] == bool($UCX_USABLE)"
expect "$want" "$DCR" doctor --topology "$T/ucx.yaml"
expect "$want" "$RELAY" --doctor --topology "$T/ucx.yaml" --node b1 -o json
json 'd["topology"]["needs"][0]["nodes"][0] == "b1"'
# UCX_TLS naming no transport makes UCX unusable whatever the build: 6.
UCX_TLS=no-such-transport expect 6 "$DCR" doctor --topology "$T/ucx.yaml"
grep -qE "^ucx +NO +a0, " "$T/out" || { cat "$T/out" >&2; fail "the table does not say ucx is not usable"; }
grep -q "^NOT READY: not usable here: ucx" "$T/out" || fail "no NOT READY line"

# TLS files that do not load: not ready here (6), the error names the file.
cp "$TOPO/local.yaml" "$T/tls.yaml"
expect 0 "$DCR" topo set "$T/tls.yaml" "defaults.tls_ca_file=$T/ca.pem" \
  "defaults.tls_cert_file=$T/cert.pem" "defaults.tls_key_file=$T/key.pem"
expect 6 "$DCR" doctor --topology "$T/tls.yaml" -o json
json 'd["tls"]["needed"] and not d["tls"]["usable"] and "ca.pem" in d["tls"]["detail"]' \
  'd["topology"]["needs"][0]["usable"] and d["ready"] is False'
expect 6 "$RELAY" --doctor --topology "$T/tls.yaml" --node a1
grep -qE "^TLS +NO +every TCP link" "$T/out" || { cat "$T/out" >&2; fail "the table does not say TLS is not usable"; }
echo "doctor: ok (ucx usable: $UCX_USABLE)"
