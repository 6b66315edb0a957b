#!/usr/bin/env bash
# deploy/slurm run for real: munged, slurmctld and three slurmd (nodes n1,
# n2, n3, one machine) on 127.0.0.1 with a slurm.conf of the test's own,
# and on them:
#   a. dcr-slurm-topology inside an allocation: the topology of its nodes
#      (from SLURM_JOB_NODELIST, NodeAddr, the root on SLURMD_NODENAME),
#      valid for dcr topo validate; a node Slurm does not know: exit 2
#   b. srun --ntasks-per-node=1 dcr-relays: one relay per node, each named
#      by the SLURMD_NODENAME of the node it runs on; a dcr refit step in
#      the same job (srun --jobid --overlap) commits on every store;
#      scancel --signal=TERM of the step stops them and srun exits 0
#   c. exit codes through srun: a relay with a name the topology lacks (2),
#      no dcr-relay binary (127), a refit step whose relays are down (1)
#   d. sbatch --wait dcr-refit.sbatch (relays as a background step, the
#      refit as the trainer's step, the relays stopped): 0 and every store
#      at the target; a refit that fails (a missing target): the job, and
#      so sbatch --wait, exits 2, and the relays are stopped all the same
# What one machine cannot show: the nodes are three slurmd on one host
# (Debian's slurmd is built with multiple-slurmd support), so every relay
# and the root share 127.0.0.1 and one filesystem. The per-host port
# counting of dcr-slurm-topology is what keeps them apart here; on a real
# cluster each node has its own address and the ports repeat. Nothing
# crosses a real network, the shared work directory the job script
# assumes (DCR_WORK) is trivially shared, NodeAddr is an IP rather than
# a name that each node must resolve, no node is lost mid-refit, and the
# cgroup plugins most clusters use (proctrack/cgroup, task/cgroup) are
# not the ones here.
# Exit 77 (skipped), with the reason, only when munged, slurmctld or a
# slurmd cannot start here (not root, the packages missing: tools/setup
# installs them).
# Usage: slurm_test.sh DCR_BINARY DCR_RELAY_BINARY TRAINGEN_BINARY SOURCE_DIR
set -euo pipefail
DCR=$1
RELAY=$2
TRAINGEN=$3
S=$4/deploy/slurm

skip() { echo "slurm_test: skipped: $*" >&2; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "slurmd must run as root (SlurmdUser=root)"
for b in munged munge slurmctld slurmd srun sbatch salloc scontrol squeue scancel sinfo; do
  command -v "$b" >/dev/null ||
    skip "no $b (tools/setup installs slurmctld, slurmd, slurm-client and munge)"
done
# This test's cluster only, whatever Slurm job or cluster it runs inside.
while read -r v; do unset "$v"; done < <(compgen -e | grep '^SLURM_' || true)

T=$(mktemp -d /tmp/dcr-slurm-test.XXXXXX)
chmod 755 "$T"
declare -A PID=()     # background commands of the test (srun, sbatch)
declare -A DAEMON=()  # munged, slurmctld, slurmd-nN
export SLURM_CONF=$T/slurm.conf
export DCR DCR_RELAY=$RELAY  # for dcr-relays and dcr-refit.sbatch

# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

# slurm_cleanup: cancel every job, stop the daemons, then anything still running
# from $T (a relay whose slurmstepd died with its slurmd), remove $T.
# shellcheck disable=SC2317  # run by the EXIT trap
slurm_cleanup() {
  set +e
  if [[ -n ${DAEMON[slurmctld]:-} ]] && kill -0 "${DAEMON[slurmctld]}" 2>/dev/null; then
    local jobs
    read -r -a jobs < <(squeue -h -o %i 2>/dev/null | tr '\n' ' ')
    [[ ${#jobs[@]} -gt 0 ]] && scancel --full --quiet "${jobs[@]}" 2>/dev/null
    for _ in $(seq 50); do [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break; sleep 0.1; done
  fi
  stop_pids "${PID[@]}"
  stop_pids "${DAEMON[slurmd-n1]:-}" "${DAEMON[slurmd-n2]:-}" "${DAEMON[slurmd-n3]:-}"
  stop_pids "${DAEMON[slurmctld]:-}" "${DAEMON[munged]:-}"
  local p
  for p in $(pgrep -f -- "$T/" 2>/dev/null); do
    [[ $p -ne $$ && $p -ne $BASHPID ]] && kill -KILL "$p" 2>/dev/null
  done
  wait 2>/dev/null
  rm -rf "$T"
}
stop_pids() {  # stop_pids PID...: SIGTERM, SIGKILL what is left after 5 s
  local p alive
  for p in "$@"; do [[ -n $p ]] && kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq 50); do
    alive=0
    for p in "$@"; do [[ -n $p ]] && kill -0 "$p" 2>/dev/null && alive=1; done
    [[ $alive -eq 0 ]] && break
    sleep 0.1
  done
  for p in "$@"; do [[ -n $p ]] && kill -KILL "$p" 2>/dev/null; done
  return 0
}
trap slurm_cleanup EXIT
trap 'exit 130' INT TERM

# free_block N: the first of N consecutive ports free now (the relays of
# one host get consecutive ports from dcr-slurm-topology).
free_block() {
  python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
    lo, _ = (int(x) for x in f.read().split())
lo = max(lo, 12000)
for base in random.sample(range(10000, lo - n), 200):
    socks = []
    try:
        for p in range(base, base + n):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", p))
        print(base)
        break
    except OSError:
        pass
    finally:
        for s in socks:
            s.close()
PY
}

# --- The cluster: munged, slurmctld, slurmd n1..n3 -----------------------
mkdir -m 755 "$T/munge" "$T/log"
mkdir -p "$T/ctld" "$T/spool"
head -c 1024 /dev/urandom >"$T/munge/munge.key"
chmod 400 "$T/munge/munge.key"
munged -F -f --key-file="$T/munge/munge.key" --socket="$T/munge/sock" \
  --pid-file="$T/munge/pid" --log-file="$T/log/munged.log" \
  --seed-file="$T/munge/seed" >"$T/log/munged.out" 2>&1 &
DAEMON[munged]=$!
for _ in $(seq 50); do
  munge -S "$T/munge/sock" -n >/dev/null 2>&1 && break
  kill -0 "${DAEMON[munged]}" 2>/dev/null || break
  sleep 0.1
done
munge -S "$T/munge/sock" -n >/dev/null 2>&1 ||
  { cat "$T/log/munged.out" "$T/log/munged.log" >&2; skip "munged did not start"; }

read -r CTLD_PORT P1 P2 P3 < <(free_ports 4)
[[ -n $P3 ]] || fail "could not pick free ports"
BASE=$(free_block 7)  # the root, 3 relays, 3 metrics ports
[[ -n $BASE ]] || fail "could not pick 7 consecutive free ports"
cat >"$SLURM_CONF" <<EOF
ClusterName=dcrtest
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$P1
AuthType=auth/munge
AuthInfo=socket=$T/munge/sock
CredType=cred/munge
StateSaveLocation=$T/ctld
SlurmdSpoolDir=$T/spool/%n
SlurmctldPidFile=$T/ctld/slurmctld.pid
SlurmdPidFile=$T/spool/%n.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmdParameters=config_overrides
# Batch jobs start at once (the default waits up to 3 s to batch them up).
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$P1 CPUs=2
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$P2 CPUs=2
NodeName=n3 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$P3 CPUs=2
PartitionName=dcr Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
slurmctld -D -i >"$T/log/slurmctld.out" 2>&1 &
DAEMON[slurmctld]=$!
for n in n1 n2 n3; do
  mkdir -p "$T/spool/$n"
  slurmd -D -N "$n" >"$T/log/$n.out" 2>&1 &
  DAEMON[slurmd-$n]=$!
done
for _ in $(seq 300); do  # every node idle within 30 s
  [[ $(sinfo -h -N -o '%N %T' 2>/dev/null | grep -c ' idle$') -eq 3 ]] && break
  for d in "${!DAEMON[@]}"; do
    kill -0 "${DAEMON[$d]}" 2>/dev/null || { tail -n 20 "$T"/log/* >&2; skip "$d exited at start"; }
  done
  sleep 0.1
done
[[ $(sinfo -h -N -o '%N %T' | grep -c ' idle$') -eq 3 ]] ||
  { sinfo -N >&2; tail -n 20 "$T"/log/* >&2; skip "the 3 slurmd did not register within 30 s"; }

# --- Checkpoints and stores ----------------------------------------------
"$TRAINGEN" --hidden 64 --layers 2 --heads 4 --kv-heads 2 --vocab 300 \
  --steps 2 --out "$T/ck" >/dev/null 2>"$T/traingen.log" ||
  { cat "$T/traingen.log" >&2; fail "traingen"; }
V=$T/ck
mkdir "$T/st"
for n in n1 n2 n3 base; do cp "$V/v0.safetensors" "$T/st/$n.safetensors"; done
TOPO_ARGS=(--root-port "$BASE" --port $((BASE + 1)) --metrics-port $((BASE + 4))
  --store "file:$T/st/{node}.safetensors" --state-dir "$T/st/root"
  --baseline "$T/st/base.safetensors")

# --- a. dcr-slurm-topology inside an allocation --------------------------
# salloc gives SLURM_JOB_NODELIST=n[1-3]; the step on n2 SLURMD_NODENAME=n2.
TOPO=$T/topology.yaml
expect 0 salloc -N3 -Q srun -N1 -n1 -w n2 "$S/dcr-slurm-topology" "${TOPO_ARGS[@]}" -o "$TOPO"
expect 0 "$DCR" topo validate "$TOPO"
expect 0 "$DCR" tree --topology "$TOPO" -o json
json 'sorted(n["name"] for n in d["nodes"]) == ["dcr-root", "n1", "n2", "n3"]'
for i in 1 2 3; do
  grep -qF "{name: n$i, host: \"127.0.0.1\", port: $((BASE + i)), store: {kind: file, path: \"$T/st/n$i.safetensors\"}, metrics_port: $((BASE + 3 + i))}" "$TOPO" ||
    { cat "$TOPO" >&2; fail "topology: relay n$i"; }
done
grep -qF "root: {name: dcr-root, host: \"127.0.0.1\", port: $BASE," "$TOPO" ||
  { cat "$TOPO" >&2; fail "topology: root"; }
expect 2 "$S/dcr-slurm-topology" --nodes 'n[1-4]'
expect_err "node 'n4'"
expect 2 "$S/dcr-slurm-topology"
expect_err "SLURM_JOB_NODELIST"

# --- b. One relay per node under srun, a refit step beside them ----------
srun -N3 --ntasks-per-node=1 -J dcr-relays -o "$T/relay-%t.log" "$S/dcr-relays" \
  --topology "$TOPO" --ready-dir "$T/ready" >"$T/relays.log" 2>&1 &
PID[relays]=$!
for n in n1 n2 n3; do
  for _ in $(seq 100); do
    [[ -s $T/ready/$n.ready ]] && break
    kill -0 "${PID[relays]}" 2>/dev/null || break
    sleep 0.1
  done
  [[ -s $T/ready/$n.ready ]] || { cat "$T"/relay*.log >&2; fail "relay $n not ready within 10 s"; }
  # The relay named n1 runs in the task Slurm placed on n1.
  pid=$(python3 -S -c "import json; d=json.load(open('$T/ready/$n.ready')); assert d['node']=='$n', d; print(d['pid'])")
  tr '\0' '\n' <"/proc/$pid/environ" | grep -qx "SLURMD_NODENAME=$n" ||
    fail "relay $n (pid $pid) does not run in a task on node $n"
done
JOB=$(squeue -h -n dcr-relays -o %i)
[[ $JOB =~ ^[0-9]+$ ]] || fail "no job dcr-relays in squeue"
expect 0 "$DCR" status --topology "$TOPO"
expect 0 srun --jobid="$JOB" --overlap -N1 -n1 -w n1 \
  "$DCR" refit --topology "$TOPO" --target "$V/v1.safetensors" --progress never -o json
json 'd["outcome"] == "committed"' 'len(d["nodes"]) == 3'
verify_all "$V/v1.safetensors" st/n1 st/n2 st/n3
expect 0 scancel --signal=TERM "$JOB.0"
set +e
wait "${PID[relays]}"
rc=$?
set -e
unset 'PID[relays]'
[[ $rc -eq 0 ]] || { cat "$T"/relay*.log >&2; fail "srun of the relays exited $rc after SIGTERM, want 0"; }
for t in 0 1 2; do
  grep -q stopping "$T/relay-$t.log" || { cat "$T/relay-$t.log" >&2; fail "relay of task $t did not log 'stopping'"; }
done

# --- c. Exit codes through srun ------------------------------------------
expect 2 srun -N1 -w n3 "$S/dcr-relays" --topology "$TOPO" --node nosuch
grep -q "no relay named 'nosuch'" "$T/err" || { cat "$T/err" >&2; fail "dcr-relays --node nosuch"; }
expect 127 env DCR_RELAY="$T/no-relay" srun -N1 "$S/dcr-relays" --topology "$TOPO"

# --- d. The job script: relays, refit, stop; the refit's exit code --------
export DCR_WORK=$T/job DCR_TOPOLOGY_ARGS="${TOPO_ARGS[*]}"
expect 0 sbatch --wait -N3 -o "$T/job.out" "$S/dcr-refit.sbatch" \
  --target "$V/v2.safetensors" --progress never
for line in "3 relays listening" "dcr refit exited 0" "relays stopped (exit 0)"; do
  grep -qF "$line" "$T/job.out" || { cat "$T/job.out" >&2; fail "job output lacks '$line'"; }
done
verify_all "$V/v2.safetensors" st/n1 st/n2 st/n3 st/base
expect 2 sbatch --wait -N3 -o "$T/job2.out" "$S/dcr-refit.sbatch" \
  --target "$T/missing.safetensors" --progress never
for line in "dcr refit exited 2" "relays stopped (exit 0)"; do
  grep -qF "$line" "$T/job2.out" || { cat "$T/job2.out" >&2; fail "failed job's output lacks '$line'"; }
done
# A refit step while no relay runs: aborted, 1.
expect 1 srun -N1 -w n2 "$DCR" refit --topology "$TOPO" --target "$V/v1.safetensors" \
  --progress never --timeout 5s
# (A job that just ended may still be listed while it completes: CG.)
for _ in $(seq 300); do [[ -z $(squeue -h -o %i) ]] && break; sleep 0.1; done
[[ -z $(squeue -h -o %i) ]] || { squeue >&2; fail "jobs left in the queue"; }
echo "slurm_test: passed"
