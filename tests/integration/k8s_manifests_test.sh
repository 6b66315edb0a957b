#!/usr/bin/env bash
# deploy/k8s against the Kubernetes API schemas (tools/k8s/validate.js:
# kubernetes-models, pinned in tools/k8s/package-lock.json) and against
# what dcr-relay needs (tools/k8s/check_relays.js: host network and IPC,
# probes, the memory limit against --memory-limit and the memory volumes,
# keys, stores; then each relay container's arguments run for real with
# the ConfigMap's topology). Mutated copies of the manifests must be
# rejected, each for its own reason, so that neither check passes by
# checking nothing.
# Usage: k8s_manifests_test.sh DCR_BINARY DCR_RELAY_BINARY SOURCE_DIR
# Exit 77 (skip) when node or tools/k8s/node_modules (tools/setup) is missing.
set -euo pipefail
DCR=$1
RELAY=$2
SRC=$3
K8S=$SRC/deploy/k8s
TOOLS=$SRC/tools/k8s

command -v node >/dev/null || { echo "SKIP: node is not installed (tools/setup installs it)"; exit 77; }
for m in kubernetes-models yaml; do
  [[ -d $TOOLS/node_modules/$m ]] ||
    { echo "SKIP: $TOOLS/node_modules/$m is missing (tools/setup runs npm ci there)"; exit 77; }
done

T=$(mktemp -d /tmp/dcr-k8s-test.XXXXXX)
# DCR_K8S_KEEP=1 keeps $T (and check_relays.js's directories) to look at.
trap '[[ -n ${DCR_K8S_KEEP:-} ]] || rm -rf "$T"' EXIT
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

validate() { node "$TOOLS/validate.js" "$@"; }
check_relays() { node "$TOOLS/check_relays.js" --dcr "$DCR" --dcr-relay "$RELAY" "$@"; }

# 1. The manifests as shipped: valid, and every relay container runs.
expect 0 validate "$K8S"
cat "$T/out"
expect 0 check_relays "$K8S"
cat "$T/out"
grep -q "relay-daemonset.yaml .*ran as node" "$T/out" ||
  fail "check_relays.js did not run the DaemonSet's relay"
grep -q "serving-sidecar.example.yaml .*ran as node" "$T/out" ||
  fail "check_relays.js did not run the sidecar example's relay"

# mutant SRC DEST SED_ARGS...: DEST is SRC edited by sed; the edit must
# change something.
mutant() {
  local src=$1 dest=$2
  shift 2
  sed "$@" "$src" >"$dest"
  ! cmp -s "$src" "$dest" || fail "sed $* changed nothing in $src"
}
# rejected FILE TEXT: the last command named FILE in an error containing TEXT.
rejected() {
  grep -F -- "$1:" "$T/err" | grep -qF -- "$2" ||
    { cat "$T/err" >&2; fail "$1 was not rejected with '$2'"; }
}

# 2. The schema check is not a no-op: each mutant breaks the schema once.
S=$T/schema
mkdir "$S"
DS=$K8S/relay-daemonset.yaml
mutant "$DS" "$S/unknown-field.yaml" 's/hostNetwork: true/hostNetwrok: true/'
mutant "$DS" "$S/port-string.yaml" 's/containerPort: 9101/containerPort: "9101"/'
mutant "$DS" "$S/wrong-type.yaml" 's/terminationGracePeriodSeconds: 120/terminationGracePeriodSeconds: 2m/'
mutant "$DS" "$S/enum.yaml" 's/imagePullPolicy: IfNotPresent/imagePullPolicy: Sometimes/'
mutant "$DS" "$S/required.yaml" 's/^  selector:/  podSelector:/'
mutant "$DS" "$S/no-schema.yaml" 's|^apiVersion: apps/v1|apiVersion: apps/v2|'
mutant "$DS" "$S/octal.yaml" 's/defaultMode: 256 .*/defaultMode: 0400/'
mutant "$DS" "$S/list.yaml" 's/drop: \["ALL"\]/drop: ALL/'
mutant "$K8S/topology-configmap.yaml" "$S/configmap.yaml" 's/^  topology.yaml: |/  replicas: 3\n&/'
expect 1 validate "$S"
rejected "$S/unknown-field.yaml" '/spec/template/spec/hostNetwrok: unknown field'
rejected "$S/port-string.yaml" '/ports/1/containerPort: must be integer'
rejected "$S/wrong-type.yaml" '/spec/template/spec/terminationGracePeriodSeconds: must be integer'
rejected "$S/enum.yaml" '/imagePullPolicy: must be equal to one of the allowed values'
rejected "$S/required.yaml" '/spec: must have required property selector'
rejected "$S/no-schema.yaml" 'no Kubernetes API schema for apiVersion "apps/v2"'
rejected "$S/octal.yaml" 'YAML 1.1 and 1.2 read this value differently'
rejected "$S/list.yaml" '/capabilities/drop: must be array'
rejected "$S/configmap.yaml" '/data/replicas: must be string'
# A manifest the kustomization does not list.
cp -r "$K8S" "$T/kust"
cp "$DS" "$T/kust/extra.yaml"
expect 1 validate "$T/kust"
rejected "$T/kust/kustomization.yaml" 'does not list extra.yaml'

# 3. The relay checks are not a no-op: each mutant DaemonSet (renamed,
# beside the shipped ConfigMap and Secret) breaks one rule.
R=$T/relay
mkdir "$R"
cp "$K8S/topology-configmap.yaml" "$K8S/keys-secret.example.yaml" "$R/"
SC=$K8S/serving-sidecar.example.yaml
relay_mutant() {  # relay_mutant NAME SRC SED_ARGS...
  local name=$1 src=$2
  shift 2
  mutant "$src" "$R/$name.yaml" -e "s/^  name: dcr-[a-z]*$/  name: $name/" "$@"
}
relay_mutant host-network "$DS" -e 's/hostNetwork: true/hostNetwork: false/'
relay_mutant host-ipc "$DS" -e '/hostIPC: true/d'
relay_mutant memory "$SC" -e 's/memory: 35328Mi/memory: 34000Mi/'
relay_mutant no-size-limit "$SC" -e '/sizeLimit: 33Gi/d'
relay_mutant ready-on-volume "$DS" -e 's|/tmp/dcr-relay.ready|/var/lib/dcr/store/ready|'
relay_mutant readiness "$DS" -e 's|command: \["test", "-s", "/tmp/dcr-relay.ready"\]|command: ["true"]|'
relay_mutant liveness "$DS" -e 's|path: /metrics|path: /healthz|'
relay_mutant liveness-port "$DS" -e 's|port: metrics|port: relay|'
relay_mutant key-mode "$DS" -e 's/defaultMode: 256/defaultMode: 288/'
# shellcheck disable=SC2016  # $(NODE_NAME) is the kubelet's, not the shell's
relay_mutant node "$DS" -e 's/--node=$(NODE_NAME)/--node=gpu-node-0/'
relay_mutant cluster "$DS" -e 's|dcr/cluster: rollout|dcr/cluster: train|'
relay_mutant no-memory-limit "$DS" -e '/--memory-limit=1GiB/d'
relay_mutant grace "$DS" -e 's/terminationGracePeriodSeconds: 120/terminationGracePeriodSeconds: 5/'
relay_mutant non-root "$DS" -e 's/runAsUser: 0/runAsUser: 1000/'
relay_mutant store "$DS" -e 's|mountPath: /var/lib/dcr/store|mountPath: /var/lib/dcr/other|'
relay_mutant undo "$SC" -e '/--undo-dir=/d'
relay_mutant socket "$SC" -e '/^            - name: run$/,+1d'
relay_mutant bad-topology "$DS" -e 's/name: dcr-topology$/name: dcr-topology-bad/'
mutant "$K8S/topology-configmap.yaml" "$R/zz-bad-topology-configmap.yaml" \
  -e 's/name: dcr-topology$/name: dcr-topology-bad/' -e 's/fanout: 2/fanout: 99/'
expect 1 check_relays --static "$R"
rejected "$R/host-network.yaml" 'hostNetwork: must be true'
rejected "$R/host-ipc.yaml" 'hostIPC: must be true'
rejected "$R/memory.yaml" "34000Mi is below --memory-limit 1GiB + the memory emptyDir(s) shm 33Gi"
rejected "$R/no-size-limit.yaml" 'a memory emptyDir needs a sizeLimit'
rejected "$R/ready-on-volume.yaml" 'is on volume store'
rejected "$R/readiness.yaml" 'readinessProbe: must be an exec probe that tests the ready file'
rejected "$R/liveness.yaml" 'httpGet/path: must be /metrics'
rejected "$R/liveness-port.yaml" "is 17001, node gpu-node-0's metrics port is 9101"
rejected "$R/key-mode.yaml" "the key file's mode is 0440"
# shellcheck disable=SC2016
rejected "$R/node.yaml" '--node must be $(NODE_NAME)'
rejected "$R/cluster.yaml" 'dcr/cluster must name a cluster of the topology with relays'
rejected "$R/no-memory-limit.yaml" 'needs --memory-limit SIZE'
rejected "$R/grace.yaml" 'terminationGracePeriodSeconds: set it to at least 30'
rejected "$R/non-root.yaml" 'runAsUser: must be 0'
rejected "$R/store.yaml" 'is on no hostPath, emptyDir or persistent volume'
rejected "$R/undo.yaml" 'give --undo-dir on a disk volume'
rejected "$R/socket.yaml" '--serving-socket /run/dcr/serving.sock: its directory must be a volume'
rejected "$R/zz-bad-topology-configmap.yaml" 'dcr topo validate'
! grep -E "^$R/(topology-configmap|keys-secret.example).yaml:" "$T/err" ||
  fail "the shipped ConfigMap or Secret was rejected beside the mutants"

# 4. The run is not a no-op: arguments the checks accept but dcr-relay
# refuses (a memory limit below its minimum) fail it.
X=$T/run
mkdir "$X"
cp "$K8S/topology-configmap.yaml" "$K8S/keys-secret.example.yaml" "$X/"
mutant "$DS" "$X/small.yaml" 's/--memory-limit=1GiB/--memory-limit=100MiB/'
expect 1 check_relays "$X"
rejected "$X/small.yaml" 'did not pass within 10 s as node gpu-node-0; dcr-relay exited 2'

echo "k8s manifests: ok"
