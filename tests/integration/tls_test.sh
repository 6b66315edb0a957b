#!/usr/bin/env bash
# TLS on TCP links with real processes: a CA and node certificates made
# with the openssl CLI, three dcr-relay daemons on free loopback ports (r0
# heads the cluster and forwards to r1 and r2), each with its own
# certificate (--tls-cert-file/--tls-key-file over the topology's
# defaults.tls_*, which name the root's):
#   a. configuration errors -> exit 2, one line naming the key or file:
#      tls_* keys not all set (dcr refit, dcr status), a key that does not
#      match the certificate, a missing CA file (dcr-relay)
#   b. a delta refit over TLS commits on every relay, bit for bit; dcr
#      status reaches every relay
#   c. a root without TLS reaches nobody (dcr status)
#   d. r2 restarted with a certificate (and CA) of another CA: r0 refuses
#      it, it is reported unreachable and the refit aborts (every store
#      keeps its bits); back with its own certificate, the next refit
#      commits everywhere
# Usage: tls_test.sh DCR_BINARY DCR_RELAY_BINARY TRAINGEN_BINARY
set -euo pipefail
DCR=$1
RELAY=$2
TRAINGEN=$3
T=$(mktemp -d /tmp/dcr-tls-test.XXXXXX)
declare -A PID=()  # relay name -> pid of the running dcr-relay

trap cleanup EXIT
trap 'exit 130' INT TERM
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

command -v openssl >/dev/null || fail "the openssl command is missing (tools/setup installs it)"

# --- Models, certificates, ports, topologies ------------------------------
"$TRAINGEN" --out "$T/ck" --hidden 128 --layers 2 --vocab 4000 --lr 2e-6 \
  --steps 2 >/dev/null 2>"$T/traingen.log" || { cat "$T/traingen.log" >&2; fail "traingen"; }
V=$T/ck

P=$T/pki
mkdir -p "$P"
make_ca() {  # make_ca NAME: $P/NAME.crt and .key, a self-signed CA
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$P/$1.key" -out "$P/$1.crt" -days 2 -subj "/CN=$1" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign" 2>>"$T/openssl.log" ||
    { cat "$T/openssl.log" >&2; fail "openssl: CA $1"; }
}
make_node() {  # make_node NAME CA: $P/NAME.crt and .key, signed by CA
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$P/$1.key" -out "$P/$1.csr" -subj "/CN=$1" 2>>"$T/openssl.log" &&
    openssl x509 -req -in "$P/$1.csr" -CA "$P/$2.crt" -CAkey "$P/$2.key" \
      -CAcreateserial -days 2 -out "$P/$1.crt" \
      -extfile <(printf 'basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n') \
      2>>"$T/openssl.log" ||
    { cat "$T/openssl.log" >&2; fail "openssl: node $1"; }
}
make_ca ca
make_ca other
for n in trainer r0 r1 r2; do make_node "$n" ca; done
make_node stranger other
chmod 600 "$P"/*.key

RELAYS=(r0 r1 r2)  # fanout 2: the root -> r0 -> r1, r2
read -r -a PORTS < <(python3 - "$((${#RELAYS[@]} + 1))" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
)
[[ ${#PORTS[@]} -eq $((${#RELAYS[@]} + 1)) ]] || fail "could not pick free ports"

write_topology() {  # write_topology FILE TLS_KEYS ("" for none)
  local i=1 n tls=""
  [[ -n $2 ]] && tls=", $2"
  {
    echo "version: 1"
    echo "defaults: {fanout: 2, min_commit: all$tls}"
    echo "root: {name: trainer, host: 127.0.0.1, port: ${PORTS[0]}, cluster: train, state_dir: \"$T/root\", baseline: \"$T/base.safetensors\"}"
    echo "clusters:"
    echo "  - name: train"
    echo "  - name: rollout"
    echo "    nodes:"
    for n in "${RELAYS[@]}"; do
      echo "      - {name: $n, host: 127.0.0.1, port: ${PORTS[$i]}, store: {kind: file, path: \"$T/$n.safetensors\"}}"
      i=$((i + 1))
    done
    echo "links:"
    echo "  - {from: train, to: rollout, bandwidth: 1Gbps, latency: 1ms}"
  } >"$1"
}
TOPO=$T/tree.yaml
write_topology "$TOPO" "tls_ca_file: \"$P/ca.crt\", tls_cert_file: \"$P/trainer.crt\", tls_key_file: \"$P/trainer.key\""
write_topology "$T/partial.yaml" "tls_ca_file: \"$P/ca.crt\", tls_cert_file: \"$P/trainer.crt\""
write_topology "$T/plain.yaml" ""
expect 0 "$DCR" tree --topology "$TOPO" -o json
json '[n["name"] for n in d["nodes"]] == ["trainer", "r0", "r1", "r2"]' \
  'd["nodes"][2]["parent"] == 1 and d["nodes"][3]["parent"] == 1'

start_relay() {  # start_relay NAME [CERT_NAME [CA_NAME]]: in the background
  local n=$1 cert=${2:-$1} ca=${3:-ca}
  rm -f "$T/$n.ready"
  "$RELAY" --topology "$TOPO" --node "$n" --ready-file "$T/$n.ready" \
    --tls-ca-file "$P/$ca.crt" --tls-cert-file "$P/$cert.crt" \
    --tls-key-file "$P/$cert.key" >>"$T/$n.log" 2>&1 &
  PID[$n]=$!
}

for n in "${RELAYS[@]}"; do cp "$V/v0.safetensors" "$T/$n.safetensors"; done
cp "$V/v0.safetensors" "$T/base.safetensors"

# --- a. Configuration errors -------------------------------------------------
for cmd in "refit --target $V/v1.safetensors" "status"; do
  # shellcheck disable=SC2086
  expect 2 "$DCR" $cmd --topology "$T/partial.yaml"
  expect_err "partial.yaml: defaults.tls_key_file is not set: TLS needs tls_ca_file, tls_cert_file and tls_key_file together"
done
expect 2 "$RELAY" --topology "$TOPO" --node r0 --tls-key-file "$P/r1.key"
expect_err "TLS key file '$P/r1.key' does not match the certificate in '$P/trainer.crt'"
expect 2 "$RELAY" --name r0 --listen "127.0.0.1:${PORTS[1]}" \
  --store "file:$T/r0.safetensors" --tls-cert-file "$P/r0.crt" \
  --tls-key-file "$P/r0.key"
expect_err "--tls-ca-file is not set"
expect 2 "$RELAY" --topology "$TOPO" --node r0 --tls-ca-file "$P/none.crt"
expect_err "TLS CA file '$P/none.crt' does not exist"
expect 0 "$DCR" verify "$T/base.safetensors" "$V/v0.safetensors"
[[ ! -e "$T/root/epoch" ]] || fail "a refused refit wrote the epoch"

# --- b. TLS everywhere: a delta refit commits ------------------------------
for n in "${RELAYS[@]}"; do start_relay "$n"; done
wait_ready "${RELAYS[@]}"
for n in "${RELAYS[@]}"; do
  grep -q "links use TLS" "$T/$n.log" || { cat "$T/$n.log" >&2; fail "relay $n did not log TLS"; }
done
refit_json 0 "$TOPO" --target "$V/v1.safetensors"
json 'd["outcome"] == "committed" and d["mode"] == "delta" and d["chunks"] > 0' \
  'all(n["committed"] and n["code"] == "ok" for n in d["nodes"])' \
  "len(d['nodes']) == ${#RELAYS[@]}"
verify_all "$V/v1.safetensors" "${RELAYS[@]}"
expect 0 "$DCR" verify "$T/base.safetensors" "$V/v1.safetensors"
expect 0 "$DCR" status --topology "$TOPO" -o json
json 'all(n["reachable"] and n["committed"]["step"] == 1 for n in d["nodes"])'

# --- c. A root without TLS reaches nobody ------------------------------------
expect 1 "$DCR" status --topology "$T/plain.yaml" -o json --timeout 2s
json 'not any(n["reachable"] for n in d["nodes"])'

# --- d. A relay with a certificate from another CA is unreachable ----------
stop_relay r2
start_relay r2 stranger other
wait_ready r2
refit_json 1 "$TOPO" --target "$V/v2.safetensors"
json 'd["outcome"] == "aborted"' \
  '[n["code"] for n in d["nodes"] if n["node"] == "r2"] == ["unreachable"]' \
  'not any(n["committed"] for n in d["nodes"])'
verify_all "$V/v1.safetensors" "${RELAYS[@]}"
expect 0 "$DCR" verify "$T/base.safetensors" "$V/v1.safetensors"
grep -q "TLS handshake with 127.0.0.1:${PORTS[3]} failed: certificate verify failed" "$T/r0.log" ||
  { cat "$T/r0.log" >&2; fail "r0 did not log why r2's handshake failed"; }
expect 1 "$DCR" status --topology "$TOPO" -o json --timeout 2s
node_json r2 'not n["reachable"] and "TLS handshake" in n["error"] and "certificate verify failed" in n["error"]'
node_json r0 'n["reachable"]'
node_json r1 'n["reachable"]'
stop_relay r2
start_relay r2
wait_ready r2
refit_json 0 "$TOPO" --target "$V/v2.safetensors"
json 'd["outcome"] == "committed"' 'all(n["committed"] for n in d["nodes"])'
verify_all "$V/v2.safetensors" "${RELAYS[@]}"
expect 0 "$DCR" verify "$T/base.safetensors" "$V/v2.safetensors"

for n in "${RELAYS[@]}"; do stop_relay "$n"; done
echo "tls: ok"
