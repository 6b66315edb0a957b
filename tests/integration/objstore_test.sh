#!/usr/bin/env bash
# The object stores (dcr/objstore.h) through dcr-objstore-tool:
#   objstore_test.sh dir|s3rver|moto TOOL SOURCE_DIR
# dir: the directory backend. s3rver, moto: the S3 backend against that
# server on loopback; each skips (77) with the reason when it is missing.
# Every backend runs the same round trips (small, empty, multipart, a
# missing object, a bad key, an object changed or truncated after upload);
# s3rver adds wrong and missing credentials, a server killed and
# restarted mid-request, a restarted empty server, and throttling, 500s
# and reset connections injected by a proxy; moto (authentication on)
# checks the SigV4 signature itself, which s3rver does not verify.
set -euo pipefail
BACKEND=$1 TOOL=$2 SRC=$3
T=$(mktemp -d)
declare -A PID=()
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=s3_servers.sh
source "$(dirname "$0")/s3_servers.sh"
trap cleanup EXIT

stat_of() { sed -n 's/.* '"$1"'=\([0-9]*\).*/\1/p' "$T/err" | tail -1; }

head -c 100000 /dev/urandom >"$T/small"
head -c 5500000 /dev/urandom >"$T/big"
: >"$T/empty"
MP=(--multipart-threshold 1048576 --part-size 1048576)

case $BACKEND in
  dir)
    ARGS=(--dir "$T/objects")
    ;;
  s3rver)
    read -r PORT PROXY_PORT <<<"$(free_ports 2)"
    start_s3rver() { start_s3rver_at "$SRC" "$1" "$PORT"; }
    start_s3rver "$T/s3"
    export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER
    ARGS=(--endpoint "http://127.0.0.1:$PORT" --bucket dcr-test --prefix dcr/)
    ;;
  moto)
    read -r PORT <<<"$(free_ports 1)"
    start_moto "$PORT" "$T/creds"
    # No key prefix: moto checks a signed LIST whose prefix holds a '/'
    # against its own encoding of it, not S3's ('%2F'), and refuses it
    # (boto3's own ListObjectsV2 fails the same way), so LIST here uses
    # prefixes without one.
    BASE=(--endpoint "http://127.0.0.1:$PORT" --bucket dcr-test)
    ARGS=("${BASE[@]}" --credentials-file "$T/creds")
    ;;
  *) fail "backend must be dir, s3rver or moto, not '$BACKEND'" ;;
esac
os() { "$TOOL" "${ARGS[@]}" "$@"; }

# --- the same cases on every backend
expect 0 os put refits/r1/c/00000001 "$T/small"
expect 0 os get refits/r1/c/00000001 "$T/got"
cmp -s "$T/small" "$T/got" || fail "small object came back different"
expect 0 os put refits/r1/c/00000000 "$T/empty"
expect 0 os get refits/r1/c/00000000 "$T/got"
[[ ! -s $T/got ]] || fail "empty object came back with bytes"
expect 0 os "${MP[@]}" put refits/r1/catchup "$T/big"
[[ $BACKEND == dir || $(stat_of multipart) == 1 ]] || fail "5.5 MB over a 1 MiB threshold was not one multipart upload"
expect 0 os get refits/r1/catchup "$T/got"
cmp -s "$T/big" "$T/got" || fail "multipart object came back different"
if [[ $BACKEND == moto ]]; then expect 0 os ls refits; else expect 0 os ls refits/r1/; fi
[[ $(cat "$T/out") == $'refits/r1/c/00000000\nrefits/r1/c/00000001\nrefits/r1/catchup' ]] ||
  { cat "$T/out" >&2; fail "ls refits/r1/ is not the three keys in order"; }
if [[ $BACKEND != moto ]]; then
  expect 0 os ls refits/r1/c/
  [[ $(wc -l <"$T/out") -eq 2 ]] || fail "ls refits/r1/c/ is not two keys"
fi
expect 2 os get refits/r1/c/00000002 "$T/got"
grep -q "refits/r1/c/00000002" "$T/err" || fail "a missing object's error does not name it"
expect 4 os put ../escape "$T/small"
grep -q "'..'" "$T/err" || fail "a '..' key is not refused as such"
expect 0 os rm refits/r1/c/00000001
expect 0 os rm refits/r1/c/00000001  # a missing object: still done
expect 2 os get refits/r1/c/00000001 "$T/got"

# An object changed, then truncated, after upload: Corruption (3), and
# nothing returned.
expect 0 os put refits/r1/c/00000003 "$T/small"
case $BACKEND in
  dir | s3rver)
    if [[ $BACKEND == dir ]]; then F=$T/objects/refits/r1/c/00000003
    else F=$T/s3/dcr-test/dcr/refits/r1/c/00000003._S3rver_object; fi
    [[ -f $F ]] || fail "no stored object at $F"
    # Flipped, not set: a byte already equal to the one written would
    # leave the object intact (1 run in 256).
    python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(777); b = f.read(1)[0]; f.seek(777); f.write(bytes([b ^ 0xff]))' "$F"
    rm -f "$T/got"
    expect 3 os get refits/r1/c/00000003 "$T/got"
    grep -q "checksum" "$T/err" || fail "a changed object's error does not say checksum"
    [[ ! -e $T/got ]] || fail "a changed object was written out"
    truncate -s 5000 "$F"
    expect 3 os get refits/r1/c/00000003 "$T/got"
    ;;
  moto)  # in memory: rewrite it through the API, keeping dcr's checksum
    "$MOTO_PY" - "$PORT" "$T/creds" <<'PY'
import configparser, sys, boto3
c = configparser.ConfigParser(); c.read(sys.argv[2])
s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{sys.argv[1]}",
                  region_name="us-east-1",
                  aws_access_key_id=c["default"]["aws_access_key_id"],
                  aws_secret_access_key=c["default"]["aws_secret_access_key"])
key = "refits/r1/c/00000003"
meta = s3.head_object(Bucket="dcr-test", Key=key)["Metadata"]
body = bytearray(s3.get_object(Bucket="dcr-test", Key=key)["Body"].read())
body[777] ^= 0x55
s3.put_object(Bucket="dcr-test", Key=key, Body=bytes(body), Metadata=meta)
s3.put_object(Bucket="dcr-test", Key="refits/r1/foreign", Body=b"x" * 100)
PY
    expect 3 os get refits/r1/c/00000003 "$T/got"
    grep -q "checksum" "$T/err" || fail "a changed object's error does not say checksum"
    expect 3 os get refits/r1/foreign "$T/got"
    grep -q "not written by dcr" "$T/err" || fail "an object without dcr's checksum is not refused as such"
    # The signature is checked here (s3rver checks only the key id).
    AWS_SECRET_ACCESS_KEY=x expect 0 os get refits/r1/catchup "$T/got"
    sed 's/^aws_secret_access_key = .*/aws_secret_access_key = wrongsecret/' "$T/creds" >"$T/badcreds"
    expect 4 "$TOOL" "${BASE[@]}" --credentials-file "$T/badcreds" get refits/r1/catchup "$T/got"
    grep -q "SignatureDoesNotMatch" "$T/err" || { cat "$T/err" >&2; fail "a wrong secret is not refused as a bad signature"; }
    grep -q "check the access key id" "$T/err" || fail "a refused signature does not say what to check"
    grep -q "wrongsecret" "$T/err" && fail "the secret is in the error"
    ;;
esac

[[ $BACKEND == s3rver ]] || { echo "PASS objstore_$BACKEND"; exit 0; }

# --- s3rver: credentials, a server that dies, and injected failures
AWS_ACCESS_KEY_ID=NOSUCHKEY expect 4 os get refits/r1/catchup "$T/got"
grep -q "InvalidAccessKeyId" "$T/err" || fail "a wrong key id is not refused as such"
(unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY; expect 4 os get refits/r1/catchup "$T/got")
grep -q "set AWS_ACCESS_KEY_ID" "$T/err" || fail "missing credentials do not say what to set"
printf '# test\n[other]\naws_access_key_id = NOPE\naws_secret_access_key = x\n[ci]\naws_access_key_id = S3RVER\naws_secret_access_key = S3RVER\n' >"$T/creds"
(unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
 expect 0 os --credentials-file "$T/creds" --profile ci get refits/r1/catchup "$T/got")
(unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
 expect 4 os --credentials-file "$T/creds" --profile nope get refits/r1/catchup "$T/got")
grep -q "no profile '\[nope\]'" "$T/err" || fail "a missing profile is not named"

# Killed mid-request and restarted: the request retries until it answers.
# (40 attempts: with full jitter about 15 s of retries, past the 1 s and
# Node's start on a loaded machine.)
kill -KILL "${PID[s3rver]}"; wait "${PID[s3rver]}" 2>/dev/null || true
"$TOOL" "${ARGS[@]}" --max-attempts 40 --retry-base-ms 200 --retry-cap-ms 800 \
  get refits/r1/catchup "$T/got" >"$T/out" 2>"$T/err" &
GETTER=$!
sleep 1
start_s3rver "$T/s3"
wait $GETTER || { cat "$T/err" >&2; fail "a get across a server restart failed"; }
[[ $(stat_of retries) -ge 1 ]] || fail "a get across a server restart did not retry"
cmp -s "$T/big" "$T/got" || fail "the object read across a restart differs"
# Restarted empty (its directory lost): missing, never stale bytes.
kill -KILL "${PID[s3rver]}"; wait "${PID[s3rver]}" 2>/dev/null || true
start_s3rver "$T/s3-empty"
expect 2 os get refits/r1/catchup "$T/got"
kill -KILL "${PID[s3rver]}"; wait "${PID[s3rver]}" 2>/dev/null || true
start_s3rver "$T/s3"

proxy() {  # proxy MODE: the fault proxy in front of s3rver
  [[ -n ${PID[proxy]:-} ]] && { kill "${PID[proxy]}"; wait "${PID[proxy]}" 2>/dev/null || true; }
  # Removed first: the shell may truncate it only after the wait below
  # has read the old proxy's "ready".
  rm -f "$T/proxy.out"
  python3 "$(dirname "$0")/s3_fault_proxy.py" "$PROXY_PORT" "$PORT" "$1" \
    >"$T/proxy.out" 2>"$T/proxy.err" &
  PID[proxy]=$!
  for _ in $(seq 50); do grep -q ready "$T/proxy.out" 2>/dev/null && return 0; sleep 0.1; done
  fail "the fault proxy did not start"
}
P=(--endpoint "http://127.0.0.1:$PROXY_PORT" --bucket dcr-test --prefix dcr/ --retry-base-ms 20)
for mode in slowdown:2 error500:3 reset:3; do
  proxy "$mode"
  expect 0 "$TOOL" "${P[@]}" "${MP[@]}" put "refits/r2/${mode%%:*}" "$T/big"
  r1=$(stat_of retries)
  expect 0 "$TOOL" "${P[@]}" get "refits/r2/${mode%%:*}" "$T/got"
  cmp -s "$T/big" "$T/got" || fail "$mode: object came back different"
  [[ $((r1 + $(stat_of retries))) -ge 2 ]] || fail "$mode: the injected failures were not retried"
done
# CompleteMultipartUpload answered 200 with an <Error>, or done with its
# answer lost (the retry finds no upload): both end in the object.
for mode in error200complete lostcomplete; do
  proxy "$mode"
  expect 0 "$TOOL" "${P[@]}" "${MP[@]}" put "refits/r2/$mode" "$T/big"
  grep -q "injected=1" "$T/proxy.err" || fail "$mode: nothing was injected"
  expect 0 os get "refits/r2/$mode" "$T/got"
  cmp -s "$T/big" "$T/got" || fail "$mode: object came back different"
done
proxy always500
expect 1 "$TOOL" "${P[@]}" --max-attempts 3 get refits/r1/catchup "$T/got"
grep -q "gave up after attempt 3" "$T/err" || { cat "$T/err" >&2; fail "giving up does not say after how many attempts"; }
grep -q "InternalError" "$T/err" || fail "giving up does not name the server's error"
echo "PASS objstore_s3rver"
