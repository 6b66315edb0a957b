#!/usr/bin/env bash
# Refits through an object store, with real processes: the root's cluster
# "train" (one relay on its link), cluster "near" fed over a tree link, and
# cluster "far" with source: objstore (its head pulls the chunks from the
# store; the link from the root carries PLAN, votes and COMMIT), frames
# keyed with an HMAC key:
#   a. a delta refit commits everywhere, bit for bit; the chunk objects
#      are in the store under refits/<id>/f/ (the END last) and "far"'s
#      link carried no chunk
#   b. the root stores one object damaged (failpoint coord.upload): the
#      head drops it, votes incomplete, and the repair round's overwrite
#      objects bring it to the target
#   c. a relay of "far" started without the objstore section refuses the
#      PLAN, naming what to fix
#   e. (dir only) an object never stored: the head skips it after 10 s,
#      votes incomplete, and the repair round fixes it
#   d. a refit that aborts (a relay damages what it applies) leaves no
#      object in the store
#   f. retention (root.keep_deltas: 1): each commit removes the objects of
#      the committed refit before it
#   g. a torn upload: the root dies while uploading (no END object); no
#      relay applies a commit, `dcr gc` keeps the unfinished refit's
#      objects, and `dcr refit --resume` aborts it, restores every relay
#      and removes them
#   h. `dcr gc`: reports a refit no record names and removes it only with
#      --unrecorded (a dry run removes nothing); with keep_deltas lowered
#      to 0 it removes the last committed refit's objects
#   i. (s3rver) throttling: a proxy answers every 4th request 503
#      SlowDown; the root's uploads and the head's reads retry; commit
#   j. (s3rver) the server killed mid-refit (uploads held meanwhile) and
#      started again on its directory once the head's reads and the root's
#      uploads have failed: uploads retry, the head reads on; commit
#   k. (moto, which checks signatures) wrong credentials: a root whose key
#      is refused stops before PLAN (exit 2, naming the store); a head
#      whose key is refused does not start (exit 2); a head whose key is
#      revoked while it runs votes no (rejected, naming the store) and the
#      refit aborts
#   l. catch-up through the store: f0 misses a refit (down); after the
#      next one it is caught up with the two recorded deltas composed into
#      one, which it pulls from the store (the catch-up's objects are then
#      removed)
# moto runs a (without counting the objects), k and b: it refuses signed
# LISTs of prefixes with a '/', so its retention is not checked.
# Usage: objstore_refit_test.sh BACKEND DCR RELAY TRAINGEN SOURCE_DIR
#   BACKEND: dir, s3rver or moto (an S3 run skips, 77, when its server is
#   not installed)
set -euo pipefail
BACKEND=$1 DCR=$2 RELAY=$3 TRAINGEN=$4 SRC=$5
T=$(mktemp -d /tmp/dcr-objstore-refit.XXXXXX)
declare -A PID=()
trap cleanup EXIT
trap 'exit 130' INT TERM
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=tests/integration/s3_servers.sh
source "$(dirname "$0")/s3_servers.sh"

"$TRAINGEN" --out "$T/ck" --hidden 128 --layers 2 --vocab 4000 --lr 2e-6 \
  --steps 3 >/dev/null 2>"$T/traingen.log" || { cat "$T/traingen.log" >&2; fail "traingen"; }
V=$T/ck
umask 077
head -c 32 /dev/urandom >"$T/frame.key"
umask 022

RELAYS=(t0 n0 n1 f0 f1 f2)
read -r -a PORTS <<<"$(free_ports 9)"
S3PORT=${PORTS[7]} PROXY_PORT=${PORTS[8]}
case $BACKEND in
  dir) OBJSTORE="objstore: {kind: dir, path: \"$T/objects\"}" ;;
  s3rver)
    start_s3rver_at "$SRC" "$T/s3" "$S3PORT"
    export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER
    OBJSTORE="objstore: {kind: s3, endpoint: \"http://127.0.0.1:$S3PORT\", bucket: dcr-test, prefix: dcr/}"
    ;;
  moto)
    start_moto "$S3PORT" "$T/creds"
    # No key prefix: moto refuses a signed LIST whose prefix holds a '/'
    # (objstore_test.sh), so the cases that LIST (d, g, h) do not run.
    OBJSTORE="objstore: {kind: s3, endpoint: \"http://127.0.0.1:$S3PORT\", bucket: dcr-test, credentials_file: \"$T/creds\"}"
    ;;
  *) fail "backend must be dir, s3rver or moto" ;;
esac

TOPO=$T/tree.yaml
{
  echo "version: 1"
  echo "defaults: {fanout: 2, min_commit: all, auth_key_file: \"$T/frame.key\"}"
  echo "root: {name: trainer, host: 127.0.0.1, port: ${PORTS[0]}, cluster: train, state_dir: \"$T/root\", baseline: \"$T/base.safetensors\", keep_deltas: 1}"
  echo "clusters:"
  echo "  - name: train"
  echo "    nodes:"
  echo "      - {name: t0, host: 127.0.0.1, port: ${PORTS[1]}, store: {kind: file, path: \"$T/t0.safetensors\"}}"
  echo "  - name: near"
  echo "    nodes:"
  echo "      - {name: n0, host: 127.0.0.1, port: ${PORTS[2]}, store: {kind: file, path: \"$T/n0.safetensors\"}}"
  echo "      - {name: n1, host: 127.0.0.1, port: ${PORTS[3]}, store: {kind: file, path: \"$T/n1.safetensors\"}}"
  echo "  - name: far"
  echo "    source: objstore"
  echo "    nodes:"
  echo "      - {name: f0, host: 127.0.0.1, port: ${PORTS[4]}, store: {kind: file, path: \"$T/f0.safetensors\"}}"
  echo "      - {name: f1, host: 127.0.0.1, port: ${PORTS[5]}, store: {kind: file, path: \"$T/f1.safetensors\"}}"
  echo "      - {name: f2, host: 127.0.0.1, port: ${PORTS[6]}, store: {kind: file, path: \"$T/f2.safetensors\"}}"
  echo "links:"
  echo "  - {from: train, to: near, bandwidth: 1Gbps, latency: 1ms}"
  echo "  - {from: train, to: far, bandwidth: 1Gbps, latency: 1ms}"
  echo "$OBJSTORE"
} >"$TOPO"

objects_of() {  # objects_of REFIT: how many objects the store holds for it
  case $BACKEND in
    dir) (find "$T/objects/refits/$1" -type f 2>/dev/null || true) | wc -l ;;
    s3rver) (find "$T/s3/dcr-test/dcr/refits/$1" -name '*._S3rver_object' 2>/dev/null || true) | wc -l ;;
  esac
}
refit_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["refit"])' "$1"; }

start_relay() {  # start_relay NAME [TOPOLOGY]
  local n=$1 topo=${2:-$TOPO}
  rm -f "$T/$n.ready"
  "$RELAY" --topology "$topo" --node "$n" --ready-file "$T/$n.ready" \
    >>"$T/$n.log" 2>&1 &
  PID[$n]=$!
}
for n in "${RELAYS[@]}"; do cp "$V/v0.safetensors" "$T/$n.safetensors"; done
cp "$V/v0.safetensors" "$T/base.safetensors"

expect 0 "$DCR" tree --topology "$TOPO"
grep -q "f0 .*chunks from the objstore" "$T/out" || { cat "$T/out" >&2; fail "dcr tree does not show f0 pulling"; }

# --- a. a delta refit through the store ----------------------------------
for n in "${RELAYS[@]}"; do start_relay "$n"; done
wait_ready "${RELAYS[@]}"
refit_json 0 "$TOPO" --target "$V/v1.safetensors"
json 'd["outcome"] == "committed" and d["chunks"] > 0' \
  'all(n["committed"] and n["code"] == "ok" for n in d["nodes"])'
cp "$T/out" "$T/refit1.json"
REFIT=$(refit_of "$T/out")
REFIT1=$REFIT
CHUNKS=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["chunks"])' "$T/out")
verify_all "$V/v1.safetensors" "${RELAYS[@]}"
grep -q "pulling refit $REFIT's chunks from" "$T/f0.log" || { cat "$T/f0.log" >&2; fail "f0 did not pull"; }
grep -q "pulling refit" "$T/n0.log" && fail "n0 (source: relay) pulled"
# Every chunk, then END: one more object than chunks (not checked on moto,
# which keeps them in memory and refuses a LIST of this prefix).
if [[ $BACKEND != moto ]]; then
  case $BACKEND in
    dir) ls "$T/objects/refits/$REFIT/f/" >"$T/objects.list" ;;
    s3rver) (cd "$T/s3/dcr-test/dcr/refits/$REFIT/f" && ls | sed -n 's/\._S3rver_object$//p') >"$T/objects.list" ;;
  esac
  [[ $(wc -l <"$T/objects.list") -eq $((CHUNKS + 1)) ]] ||
    { grep -i "objstore\|dropping" "$T/f0.log" >&2; cat "$T/refit1.json" >&2; fail "$(wc -l <"$T/objects.list") objects for $CHUNKS chunks and END"; }
  [[ $(head -1 "$T/objects.list") == 0000000000 ]] || fail "objects do not start at 0000000000"
fi

# --- k. wrong credentials (moto checks signatures; s3rver does not) ------
if [[ $BACKEND == moto ]]; then
  printf '[default]\naws_access_key_id = AKIAWRONG\naws_secret_access_key = wrong\n' >"$T/wrong.creds"
  sed "s|credentials_file: \"$T/creds\"|credentials_file: \"$T/wrong.creds\"|" "$TOPO" >"$T/wrong.yaml"
  grep -q wrong.creds "$T/wrong.yaml" || fail "could not make the wrong-credentials topology"
  refit_json 2 "$T/wrong.yaml" --target "$V/v2.safetensors"
  grep -q "refused a test write before PLAN" "$T/err" || { cat "$T/err" >&2; fail "the root's refused credentials are not named"; }
  verify_all "$V/v1.safetensors" "${RELAYS[@]}"
  expect 2 "$RELAY" --topology "$T/wrong.yaml" --node f0 --ready-file "$T/f0-wrong.ready"
  grep -q "refuses node 'f0'" "$T/err" || { cat "$T/err" >&2; fail "dcr-relay with refused credentials does not say so"; }

  # The head's key revoked while it runs: its reads are refused mid-refit,
  # it stops pulling, takes the END from its link and votes no, naming the
  # store; the refit aborts and every relay keeps v1.
  moto_iam "$T/creds" create head "$T/head.creds"
  sed "s|credentials_file: \"$T/creds\"|credentials_file: \"$T/head.creds\"|" "$TOPO" >"$T/head.yaml"
  stop_relay f0
  start_relay f0 "$T/head.yaml"
  wait_ready f0
  moto_iam "$T/creds" revoke head
  refit_json 1 "$TOPO" --target "$V/v2.safetensors"
  json 'd["outcome"] == "aborted"'
  node_json f0 'n["code"] == "rejected" and "cannot read the chunks from the object store" in n["detail"]'
  verify_all "$V/v1.safetensors" "${RELAYS[@]}"
  stop_relay f0
  start_relay f0
  wait_ready f0
fi

# --- b. a damaged object: dropped, voted incomplete, repaired ----------
# The root stores its 3rd object damaged (coord.upload=corrupt@3): f0's
# frame check fails, it drops the chunk and votes incomplete naming the
# tensor; the repair round's overwrite chunks reach it as new objects.
DCR_FAILPOINTS=coord.upload=corrupt@3 refit_json 0 "$TOPO" --target "$V/v2.safetensors"
json 'd["outcome"] == "committed" and d["repair_rounds"] >= 1'
REFIT2=$(refit_of "$T/out")
verify_all "$V/v2.safetensors" "${RELAYS[@]}"
grep -q "dropping an object of refit" "$T/f0.log" || { cat "$T/f0.log" >&2; fail "f0 did not drop the damaged object"; }
if [[ $BACKEND == moto ]]; then echo "PASS objstore_refit_$BACKEND"; exit 0; fi
# f. keep_deltas: 1: this commit removed the first refit's objects.
[[ $(objects_of "$REFIT1") -eq 0 ]] || fail "refit $REFIT1's objects are kept after a later commit (keep_deltas: 1)"
[[ $(objects_of "$REFIT2") -gt 0 ]] || fail "the last committed refit's objects are gone"

# --- c. a head without the object store refuses the PLAN -----------------
sed '/^objstore:/d; s/    source: objstore//' "$TOPO" >"$T/plain.yaml"
stop_relay f0
start_relay f0 "$T/plain.yaml"
wait_ready f0
refit_json 1 "$TOPO" --target "$V/v3.safetensors"
node_json f0 'n["code"] == "rejected" and "has none: start it with --topology naming the objstore" in n["detail"]'
verify_all "$V/v2.safetensors" f0

stop_relay f0
start_relay f0
wait_ready f0

# --- e. an object never stored (dir store only: it waits 10 s) -----------
# The root never stores its 2nd object (coord.upload=drop@2): the head
# skips it 10 s after a later one appeared, votes incomplete, and the
# repair round brings it to the target.
if [[ $BACKEND == dir ]]; then
  DCR_FAILPOINTS=coord.upload=drop@2 expect 0 "$DCR" refit --topology "$TOPO" \
    --progress never -o json --timeout 30s --target "$V/v3.safetensors"
  json 'd["outcome"] == "committed" and d["repair_rounds"] >= 1'
  KEPT=$(refit_of "$T/out")
  grep -q "is still missing 10 s after a later object appeared" "$T/f0.log" ||
    { cat "$T/f0.log" >&2; fail "f0 did not skip the missing object"; }
  verify_all "$V/v3.safetensors" "${RELAYS[@]}"
  [[ $(objects_of "$REFIT2") -eq 0 ]] || fail "refit $REFIT2's objects are kept after a later commit"
  GOOD=$V/v3.safetensors NEXT=$V/v2.safetensors
else
  KEPT=$REFIT2
  GOOD=$V/v2.safetensors NEXT=$V/v3.safetensors
fi

# --- d. an aborted refit's objects are removed ----------------------------
# n1 damages every chunk it applies: its votes stay no through the repair
# rounds, the refit aborts, and the root removes the refit's objects.
stop_relay n1
rm -f "$T/n1.ready"
DCR_FAILPOINTS=relay.apply_chunk=corrupt "$RELAY" --topology "$TOPO" --node n1 \
  --ready-file "$T/n1.ready" >>"$T/n1.log" 2>&1 &
PID[n1]=$!
wait_ready n1
refit_json 1 "$TOPO" --target "$NEXT"
json 'd["outcome"] == "aborted" and d["chunks"] > 0'
REFIT=$(refit_of "$T/out")
grep -q "pulling refit $REFIT's chunks" "$T/f0.log" || fail "f0 did not pull the aborted refit"
[[ $(objects_of "$REFIT") -eq 0 ]] || fail "$(objects_of "$REFIT") objects of the aborted refit $REFIT are left"
grep -q "removed refit $REFIT's [1-9][0-9]* objects" "$T/err" || { cat "$T/err" >&2; fail "the root did not remove the aborted refit's objects"; }
[[ $(objects_of "$KEPT") -gt 0 ]] || fail "an abort removed the last committed refit's objects"
verify_all "$GOOD" "${RELAYS[@]}"
stop_relay n1
start_relay n1
wait_ready n1

# --- g. a torn upload: the root dies mid-upload --------------------------
# The root exits as it stores its 5th object (coord.upload=exit@5): no END
# object, no decision. Nothing is committed anywhere; dcr gc keeps the
# unfinished refit's objects; --resume aborts it and removes them.
DCR_FAILPOINTS=coord.upload=exit@5 expect 86 "$DCR" refit --topology "$TOPO" \
  --progress never -o json --timeout 10s --target "$NEXT"
TORN=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["refit"])' "$T/root/current.json")
expect 0 "$DCR" gc --topology "$TOPO" -o json
json "any(r['refit'] == '$TORN' and not r['removed'] and r['why'] == 'its refit is not over' for r in d['refits'])" \
  "any(r['refit'] == '$KEPT' and r['state'] == 'committed' and not r['removed'] for r in d['refits'])"
refit_json 1 "$TOPO" --resume
json 'd["outcome"] == "aborted"'
[[ $(objects_of "$TORN") -eq 0 ]] || fail "the torn upload's objects are left after --resume"
verify_all "$GOOD" "${RELAYS[@]}"

# --- h. dcr gc -----------------------------------------------------------
# A refit no record names (another root's): reported, removed only with
# --unrecorded; a dry run removes nothing.
OTHER=0123456789abcdef0123456789abcdef
case $BACKEND in
  dir) mkdir -p "$T/objects/refits/$OTHER" && cp -r "$T/objects/refits/$KEPT/." "$T/objects/refits/$OTHER/" ;;
  s3rver) mkdir -p "$T/s3/dcr-test/dcr/refits/$OTHER" && cp -r "$T/s3/dcr-test/dcr/refits/$KEPT/." "$T/s3/dcr-test/dcr/refits/$OTHER/" ;;
esac
N_OTHER=$(objects_of "$OTHER")
[[ $N_OTHER -gt 0 ]] || fail "could not plant another root's objects"
expect 0 "$DCR" gc --topology "$TOPO"
grep -q "$OTHER  unrecorded .* kept " "$T/out" || { cat "$T/out" >&2; fail "dcr gc does not report the unrecorded refit as kept"; }
expect 0 "$DCR" gc --topology "$TOPO" --unrecorded --dry-run -o json
json "any(r['refit'] == '$OTHER' and r['removed'] and r['objects'] == $N_OTHER for r in d['refits'])" \
  'd["dry_run"] and d["objects_removed"] == 0'
[[ $(objects_of "$OTHER") -eq $N_OTHER ]] || fail "a dry run removed objects"
expect 0 "$DCR" gc --topology "$TOPO" --unrecorded -o json
json "d['objects_removed'] == $N_OTHER"
[[ $(objects_of "$OTHER") -eq 0 ]] || fail "dcr gc --unrecorded left the unrecorded refit"
[[ $(objects_of "$KEPT") -gt 0 ]] || fail "dcr gc removed the last committed refit"
# keep_deltas lowered to 0: the last committed refit goes too.
expect 0 "$DCR" topo set "$TOPO" root.keep_deltas=0
expect 0 "$DCR" gc --topology "$TOPO"
[[ $(objects_of "$KEPT") -eq 0 ]] || fail "dcr gc kept a committed refit with keep_deltas 0"
grep -q "^removed [1-9][0-9]* objects" "$T/out" || { cat "$T/out" >&2; fail "dcr gc's summary"; }

# --- i, j. (s3rver) throttling, and the server restarted mid-refit -------
if [[ $BACKEND == s3rver ]]; then
  # Everyone reaches the store through the proxy: root, and f0 restarted
  # with that topology.
  python3 -u "$SRC/tests/integration/s3_fault_proxy.py" "$PROXY_PORT" "$S3PORT" slowdown:4 \
    >"$T/proxy.out" 2>"$T/proxy.err" &
  PID[proxy]=$!
  for _ in $(seq 50); do grep -q ready "$T/proxy.out" 2>/dev/null && break; sleep 0.1; done
  sed "s|127.0.0.1:$S3PORT|127.0.0.1:$PROXY_PORT|" "$TOPO" >"$T/proxy.yaml"
  stop_relay f0
  start_relay f0 "$T/proxy.yaml"
  wait_ready f0
  refit_json 0 "$T/proxy.yaml" --target "$V/v1.safetensors"
  json 'd["outcome"] == "committed"'
  verify_all "$V/v1.safetensors" "${RELAYS[@]}"
  [[ $(grep -c injected "$T/proxy.err") -ge 3 ]] || fail "the proxy injected $(grep -c injected "$T/proxy.err") SlowDowns"

  # j. s3rver killed mid-refit and started again. Every upload (chunks and
  # END) is held (coord.upload=wait(FILE)) until the test has killed the
  # server and seen f0's reads fail while it is down (f0 reads with one
  # attempt and polls again itself, so each failed read is logged); then
  # the uploads go on against the dead server and retry, and once the
  # root has logged a retry the server is started again. The first held
  # upload comes after PLAN, so the root's probe of the store is done.
  stop_relay f0
  start_relay f0
  wait_ready f0
  F0_LINES=$(wc -l <"$T/f0.log")
  rm -f "$T/j.go"
  release_on_exit "$T/j.go"
  DCR_FAILPOINTS="coord.upload=wait($T/j.go)" "$DCR" refit --topology "$TOPO" \
    --progress never -o json --timeout 30s --target "$V/v2.safetensors" \
    >"$T/restart.json" 2>"$T/restart.err" &
  REFIT_PID=$!
  held=0
  for _ in $(seq 600); do
    grep -q "failpoint coord.upload (hit 1): wait" "$T/restart.err" && { held=1; break; }
    sleep 0.05
  done
  [[ $held -eq 1 ]] || { cat "$T/restart.err" >&2; fail "no upload reached the held failpoint"; }
  kill -KILL "${PID[s3rver]}" 2>/dev/null || true
  wait "${PID[s3rver]}" 2>/dev/null || true
  saw_down=0
  for _ in $(seq 300); do
    if tail -n +"$((F0_LINES + 1))" "$T/f0.log" | grep -q "objstore: refits/.*: I/O error"; then
      saw_down=1
      break
    fi
    sleep 0.1
  done
  touch "$T/j.go"
  retried=0
  for _ in $(seq 300); do
    grep -q "objstore: refits/.* not uploaded (" "$T/restart.err" && { retried=1; break; }
    sleep 0.05
  done
  start_s3rver_at "$SRC" "$T/s3" "$S3PORT"
  [[ $retried -eq 1 ]] || { cat "$T/restart.err" >&2; fail "the root did not retry an upload while s3rver was down"; }
  [[ $saw_down -eq 1 ]] ||
    { tail -n +"$((F0_LINES + 1))" "$T/f0.log" >&2; fail "f0 never saw the store down"; }
  set +e; wait "$REFIT_PID"; rc=$?; set -e
  [[ $rc -eq 0 ]] || { cat "$T/restart.err" >&2; fail "the refit across an s3rver restart exited $rc"; }
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["outcome"] == "committed", d["outcome"]' "$T/restart.json"
  verify_all "$V/v2.safetensors" "${RELAYS[@]}"
  CUR=$V/v2.safetensors OTHER_V=$V/v3.safetensors
else
  CUR=$GOOD OTHER_V=$NEXT
fi

# --- l. catch-up through the store ---------------------------------------
# f0 is down for a refit CUR -> OTHER_V (min_commit 5 commits without it:
# f1 and f2 are re-parented); back up, it is a step behind, so the next
# refit (to v1) excludes it, and its catch-up composes the two recorded
# deltas (root.keep_deltas 4) into one, whose chunks f0 pulls from the
# store like any refit's; the catch-up's objects are then removed.
cp "$TOPO" "$T/catch.yaml"
expect 0 "$DCR" topo set "$T/catch.yaml" defaults.min_commit=5 root.keep_deltas=4
stop_relay f0
refit_json 3 "$T/catch.yaml" --target "$OTHER_V"
node_json f0 'not n["committed"]'
verify_all "$OTHER_V" t0 n0 n1 f1 f2
verify_all "$CUR" f0
start_relay f0
wait_ready f0
refit_json 0 "$T/catch.yaml" --target "$V/v1.safetensors"
json 'd["outcome"] == "committed"' \
  'any("f0" in c["nodes"] and c["method"] == "history" and c["deltas"] == 2 and c["outcome"] == "committed" and c["chunks"] > 0 for c in d["catch_up"])'
CATCHUP=$(python3 -c 'import json,sys; print([c["refit"] for c in json.load(open(sys.argv[1]))["catch_up"] if "f0" in c["nodes"]][0])' "$T/out")
grep -q "pulling refit $CATCHUP's chunks" "$T/f0.log" || { cat "$T/f0.log" >&2; fail "f0 was not caught up through the store"; }
[[ $(objects_of "$CATCHUP") -eq 0 ]] || fail "the catch-up's objects are kept (a refit of named nodes)"
verify_all "$V/v1.safetensors" "${RELAYS[@]}"
echo "PASS objstore_refit_$BACKEND"
