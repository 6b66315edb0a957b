# Test S3 servers on loopback for the object store tests (sourced after
# lib.sh; T and PID set). Each start_* function skips the test (exit 77,
# naming why) when its server is not installed.
#   start_s3rver_at SRC DIR PORT s3rver from tools/s3rver (npm ci by
#                                tools/setup), bucket dcr-test, objects
#                                kept in DIR; it does not check signatures
#   start_moto PORT CREDS        moto_server with authentication on: an
#                                IAM user's keys are written to CREDS (an
#                                AWS shared-credentials file); bucket
#                                dcr-test; in memory. Sets MOTO_PY, its
#                                Python (with boto3)
skip() { echo "SKIP: $*"; exit 77; }

start_s3rver_at() {
  local s3rver=$1/tools/s3rver/node_modules/.bin/s3rver dir=$2 port=$3
  [[ -x $s3rver ]] || skip "s3rver is not installed (tools/setup runs npm ci in tools/s3rver)"
  "$s3rver" -d "$dir" -a 127.0.0.1 -p "$port" --configure-bucket dcr-test \
    --silent >>"$T/s3rver.log" 2>&1 &
  PID[s3rver]=$!
  for _ in $(seq 100); do
    curl -s -o /dev/null "http://127.0.0.1:$port/" && return 0
    sleep 0.1
  done
  cat "$T/s3rver.log" >&2
  fail "s3rver did not start within 10 s"
}

start_moto() {
  local port=$1 creds=$2
  S3_MOTO_PORT=$port
  command -v moto_server >/dev/null || skip "moto_server is not installed"
  # Its Python (for boto3, to set it up): the shebang of the real script
  # behind a pyenv shim or of moto_server itself.
  local bin
  bin=$( (pyenv which moto_server 2>/dev/null) || command -v moto_server)
  MOTO_PY=$(sed -n '1s/^#! *\([^ ]*\).*/\1/p' "$bin")
  [[ -x $MOTO_PY ]] || skip "cannot find moto_server's Python (shebang of $bin)"
  "$MOTO_PY" -c 'import boto3' 2>/dev/null || skip "moto_server's Python has no boto3 to set it up"
  # Authentication on after the 4 unsigned set-up actions below; parts
  # of 1 MiB allowed (S3 and moto's default refuse parts under 5 MiB).
  INITIAL_NO_AUTH_ACTION_COUNT=4 S3_UPLOAD_PART_MIN_SIZE=1048576 \
    moto_server -H 127.0.0.1 -p "$port" >"$T/moto.log" 2>&1 &
  PID[moto]=$!
  for _ in $(seq 150); do
    curl -s -o /dev/null "http://127.0.0.1:$port/moto-api/" && break
    sleep 0.1
  done
  "$MOTO_PY" - "$port" "$creds" <<'PY' || { cat "$T/moto.log" >&2; fail "moto set-up failed"; }
import json, sys, boto3
url = f"http://127.0.0.1:{sys.argv[1]}"
kw = dict(endpoint_url=url, region_name="us-east-1",
          aws_access_key_id="setup", aws_secret_access_key="setup")
iam = boto3.client("iam", **kw)
iam.create_user(UserName="dcr")
key = iam.create_access_key(UserName="dcr")["AccessKey"]
iam.put_user_policy(UserName="dcr", PolicyName="all", PolicyDocument=json.dumps(
    {"Version": "2012-10-17",
     "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
boto3.client("s3", **kw).create_bucket(Bucket="dcr-test")
with open(sys.argv[2], "w") as f:
    f.write(f"[default]\naws_access_key_id = {key['AccessKeyId']}\n"
            f"aws_secret_access_key = {key['SecretAccessKey']}\n")
PY
}

# moto_iam ADMIN_CREDS ACTION USER [CREDS]: with the admin's keys (start_moto's
# CREDS), `create` makes USER with full access and writes its keys to CREDS;
# `revoke` deletes USER's access keys (its requests are refused from then on).
moto_iam() {
  "$MOTO_PY" - "$S3_MOTO_PORT" "$@" <<'PY' || { cat "$T/moto.log" >&2; fail "moto IAM $2 $3 failed"; }
import configparser, json, sys, boto3
port, admin, action, user = sys.argv[1:5]
c = configparser.ConfigParser(); c.read(admin)
iam = boto3.client("iam", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                   aws_access_key_id=c["default"]["aws_access_key_id"],
                   aws_secret_access_key=c["default"]["aws_secret_access_key"])
if action == "create":
    iam.create_user(UserName=user)
    key = iam.create_access_key(UserName=user)["AccessKey"]
    iam.put_user_policy(UserName=user, PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17",
         "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    with open(sys.argv[5], "w") as f:
        f.write(f"[default]\naws_access_key_id = {key['AccessKeyId']}\n"
                f"aws_secret_access_key = {key['SecretAccessKey']}\n")
elif action == "revoke":
    for k in iam.list_access_keys(UserName=user)["AccessKeyMetadata"]:
        iam.delete_access_key(UserName=user, AccessKeyId=k["AccessKeyId"])
PY
}
