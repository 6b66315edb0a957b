#!/usr/bin/env bash
# tools/testbed end to end (needs root and network namespaces; else exit 77,
# a skip): a two-region testbed with 2 relays per cluster (a copy of
# topology/two-region.yaml), a seeding --full refit and a delta refit of a
# small traingen model from the root's namespace, every store verified, the
# WAN link measured to be rate-limited by tc, then `testbed down` twice,
# also after a kill -9 of `testbed up`, leaving nothing with the prefix.
# Usage: testbed_test.sh DCR DCR_RELAY DCR_TRAINGEN
set -euo pipefail
DCR=$(realpath "$1")
RELAY=$(realpath "$2")
TRAINGEN=$(realpath "$3")
SRC=$(cd "$(dirname "$0")/../.." && pwd)
TESTBED=$SRC/tools/testbed

skip() { echo "SKIP: $*" >&2; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root (network namespaces, veth, tc)"
PROBE=tbp$$
ip netns add "$PROBE" 2>/dev/null || skip "network namespaces are not permitted here"
ip netns del "$PROBE"

T=$(mktemp -d /tmp/dcr-testbed-test.XXXXXX)
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
P=ti$((RANDOM % 10000))$(($$ % 1000))  # <= 10 chars, unique per run
P2=${P}k
on_exit() {
  "$TESTBED" down --prefix "$P" >/dev/null 2>&1 || true
  "$TESTBED" down --prefix "$P2" >/dev/null 2>&1 || true
  rm -rf "$T"
}
trap on_exit EXIT

leftovers() {  # leftovers PREFIX: fails if a namespace, link or registry entry remains
  if ip netns list | grep -q "^$1-"; then ip netns list >&2; fail "namespaces of $1 remain"; fi
  if ip -o link show | grep -q ": $1"; then fail "host links of $1 remain"; fi
  [[ ! -e /run/dcr-testbed/$1.json ]] || fail "registry entry of $1 remains"
}

# Two relays per cluster: a0 -> a1 and b0 -> b1 behind 200 Mbit/s WAN links.
cp "$SRC/topology/two-region.yaml" "$T/topo.yaml"
for n in a2 a3 b2 b3; do expect 0 "$DCR" topo remove-node "$T/topo.yaml" --name "$n"; done
expect 0 "$DCR" topo validate "$T/topo.yaml"

expect 0 "$TRAINGEN" --out "$T/ckpt" --hidden 256 --layers 2 --vocab 4000 --steps 1 \
  --lr 2e-6 --threads 2 -o json
V0=$T/ckpt/v0.safetensors V1=$T/ckpt/v1.safetensors

expect 0 "$TESTBED" up --topology "$T/topo.yaml" --prefix "$P" --dcr "$DCR" \
  --relay "$RELAY" --dir "$T/tb"
grep -q "ip netns exec $P-root" "$T/out" || { cat "$T/out" >&2; fail "up did not say how to refit"; }
TOPO=$T/tb/topology.yaml
for ns in root a0 a1 b0 b1 sw-train sw-rollout-a sw-rollout-b; do
  ip netns list | grep -q "^$P-$ns\b" || fail "namespace $P-$ns missing"
done
tc -n "$P-sw-train" qdisc show dev w0 | grep -q 'tbf.*rate 200Mbit' \
  || { tc -n "$P-sw-train" qdisc show >&2; fail "no 200Mbit tbf on the WAN link"; }

in_root() { ip netns exec "$P-root" "$@"; }
expect 0 in_root "$DCR" refit --topology "$TOPO" --target "$V0" --full -o json --progress never
json "d['outcome'] == 'committed'" "d['mode'] == 'full'" "len(d['nodes']) == 4"
expect 0 in_root "$DCR" refit --topology "$TOPO" --target "$V1" -o json --progress never
json "d['outcome'] == 'committed'" "d['mode'] == 'delta'" \
  "d['payload_bytes'] < d['checkpoint_bytes'] / 5" "d['link_class_bytes']['wan'] > 0"
for n in a0 a1 b0 b1; do expect 0 "$DCR" verify "$T/tb/stores/$n.safetensors" "$V1"; done
expect 0 "$DCR" verify "$T/tb/root/base.safetensors" "$V1"

# The WAN link is the tbf: 10 MB from the root to a0 take >= 0.8 x 0.4 s.
# (and not more than 3x: the shaping, not something else, sets the pace).
ip netns exec "$P-a0" python3 -S - >"$T/rx" <<'PY' &
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 18999))
s.listen(1)
print("listening", flush=True)
c, _ = s.accept()
n = 0
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    n += len(b)
print(n, flush=True)
PY
RX=$!
for _ in $(seq 50); do grep -q listening "$T/rx" && break; sleep 0.1; done
A0=$(python3 -c "import json; print([h['addr'] for h in json.load(open('$T/tb/testbed.json'))['hosts'] if h['name'] == 'a0'][0])")
expect 0 in_root python3 -S -c "
import socket, time
buf = bytes(1 << 20)
s = socket.create_connection(('$A0', 18999))
t = time.time()
for _ in range(10):
    s.sendall(buf)
s.shutdown(socket.SHUT_WR)
s.recv(1)
print(time.time() - t)
"
wait "$RX"
secs=$(cat "$T/out")
[[ $(tail -n 1 "$T/rx") == 10485760 ]] || fail "a0 received $(tail -n 1 "$T/rx") bytes, want 10485760"
python3 -c "
import sys; s = $secs; want = 10485760 * 8 / 200e6
print(f'WAN: 10 MiB in {s:.3f} s, {10485760 * 8 / s / 1e6:.0f} Mbit/s (tbf 200 Mbit/s)')
sys.exit(0 if 0.8 * want <= s <= 3 * want else 1)" >&2 \
  || fail "10 MiB over the 200 Mbit/s WAN took $secs s; want 0.34-1.26 s"

expect 0 "$TESTBED" down --prefix "$P"
expect 0 "$TESTBED" down --prefix "$P"
leftovers "$P"
[[ ! -e $T/tb ]] || fail "down left the run dir $T/tb"
pgrep -f "$TOPO" >/dev/null && fail "a relay of $P still runs"

# A crash of `up` part way (kill -9 while it builds or starts relays):
# down cleans up all the same, twice.
"$TESTBED" up --topology "$T/topo.yaml" --prefix "$P2" --dcr "$DCR" --relay "$RELAY" \
  --dir "$T/tb2" >"$T/up2.out" 2>&1 &
UP=$!
for _ in $(seq 100); do ip netns list | grep -q "^$P2-" && break; sleep 0.02; done
sleep 0.3
kill -KILL "$UP" 2>/dev/null || true  # (up may have finished already)
wait "$UP" 2>/dev/null || true
expect 0 "$TESTBED" down --prefix "$P2"
expect 0 "$TESTBED" down --prefix "$P2"
leftovers "$P2"
pgrep -f "$T/tb2/topology.yaml" >/dev/null && fail "a relay of $P2 still runs"

# Not root: exit 2 with a clear message (nobody may not exist: then skip it).
if id nobody >/dev/null 2>&1 && command -v setpriv >/dev/null; then
  expect 2 setpriv --reuid=nobody --regid=nogroup --clear-groups "$TESTBED" down --prefix "$P"
  grep -q "needs root" "$T/err" || { cat "$T/err" >&2; fail "no 'needs root' message"; }
fi
echo "PASS"
