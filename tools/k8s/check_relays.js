#!/usr/bin/env node
'use strict';
// Usage: node tools/k8s/check_relays.js --dcr DCR --dcr-relay DCR_RELAY
//                                      [--static] DIR
//
// What the Kubernetes schemas cannot say about the dcr-relay containers of
// the manifests in DIR (every container whose command is dcr-relay, in a
// DaemonSet, Deployment, StatefulSet, Job or Pod), checked against the
// topology of the ConfigMap it mounts (read with `dcr topo show`):
//
// - the pod uses the host's network, and the host's IPC namespace unless
//   its /dev/shm is a memory emptyDir; it selects the nodes of one
//   topology cluster (nodeSelector dcr/cluster), and each relay finds its
//   node by --node=$(NODE_NAME), NODE_NAME being spec.nodeName;
// - the memory limit is at least --memory-limit plus the sizeLimit of
//   every memory emptyDir the container mounts (each must have one);
// - the readiness and startup probes test --ready-file, which is on the
//   container's own file system; liveness is GET /metrics on the metrics
//   port of every node of the cluster; the container declares the nodes'
//   relay and metrics ports;
// - the key file is in a Secret volume that group and others cannot read,
//   with no fsGroup, read by root; the signing public key is mounted too;
//   the store is on a volume (file) or in a /dev/shm the pod shares (shm),
//   with --undo-dir on disk; a --serving-socket's directory is a volume
//   another container mounts; terminationGracePeriodSeconds >= 30.
//
// Then, unless --static, each relay container runs for real: the first node
// of its cluster, its volumes laid out under a temporary directory (the
// ConfigMap's files, a generated key and public key with the Secret's
// modes, as symlinks like the kubelet's), its arguments as the kubelet
// expands them with those paths, the node's host and ports moved to
// loopback and free ports. The readiness probe's command must pass within
// 10 s, GET on the liveness probe's path must answer 200, `--doctor` with
// the same arguments must exit 0, and SIGTERM must stop it with exit 0.
//
// Prints one line per problem and exits 1 if there is any.

const fs = require('fs');
const os = require('os');
const path = require('path');
const http = require('http');
const net = require('net');
const crypto = require('crypto');
const { spawn, spawnSync } = require('child_process');
const { expandPaths, loadFiles } = require('./manifests.js');

// Short paths: a serving socket's must fit in 107 bytes.
const TMP = fs.existsSync('/tmp') ? '/tmp' : os.tmpdir();

const WORKLOADS = new Set(['DaemonSet', 'Deployment', 'StatefulSet', 'ReplicaSet', 'Job', 'Pod']);

// dcr's sizes (src/topology/units.cc ParseSize): a number, an optional
// k/M/G/T prefix (Ki/Mi/Gi/Ti binary), an optional B.
function parseDcrSize(s) {
  const m = /^([0-9]+(?:\.[0-9]+)?)([kKmMgGtT]i?)?B?$/.exec(String(s).trim());
  if (!m) return null;
  const exp = { k: 1, m: 2, g: 3, t: 4 };
  let mult = 1;
  if (m[2]) {
    const e = exp[m[2][0].toLowerCase()];
    mult = m[2].endsWith('i') ? 1024 ** e : 1000 ** e;
  }
  if (mult === 1 && m[1].includes('.')) return null;
  return Math.round(Number(m[1]) * mult);
}

// Kubernetes quantities (resource.Quantity): 1536Mi, 2G, 1e9, 0.5Gi.
function parseQuantity(q) {
  if (typeof q === 'number') return q;
  const m = /^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E))?$/.exec(
    String(q),
  );
  if (!m) return null;
  const bin = { Ki: 1, Mi: 2, Gi: 3, Ti: 4, Pi: 5, Ei: 6 };
  const dec = { m: -1, k: 1, M: 2, G: 3, T: 4, P: 5, E: 6 };
  let v = Number(m[1]);
  if (m[2]) v *= 10 ** Number(m[2].slice(1));
  else if (m[3] in bin) v *= 1024 ** bin[m[3]];
  else if (m[3]) v *= 1000 ** dec[m[3]];
  return v;
}

const MiB = 1024 * 1024;
const mib = (n) => `${(n / MiB).toFixed(0)}Mi`;

// Splits a dcr-relay argument list into {options: Map name -> value (true
// for a flag without one), order: [[name, value, index]]}.
function parseArgs(args) {
  const options = new Map();
  const order = [];
  for (let i = 0; i < args.length; i++) {
    const a = String(args[i]);
    if (!a.startsWith('-')) {
      order.push([null, a, i]);
      continue;
    }
    const eq = a.indexOf('=');
    let name;
    let value;
    if (eq > 0) {
      name = a.slice(0, eq);
      value = a.slice(eq + 1);
    } else if (i + 1 < args.length && !String(args[i + 1]).startsWith('-')) {
      name = a;
      value = String(args[++i]);
    } else {
      name = a;
      value = true;
    }
    options.set(name, value);
    order.push([name, value, i]);
  }
  return { options, order };
}

// The kubelet's $(VAR) expansion of command and args ($$ escapes).
function expand(s, env) {
  return String(s).replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)/g, (all, name) => {
    if (all === '$$') return '$';
    return Object.prototype.hasOwnProperty.call(env, name) ? env[name] : all;
  });
}

// The mount of a container whose directory holds `p` (the longest).
function mountOf(container, p) {
  let best = null;
  for (const vm of container.volumeMounts || []) {
    const mp = vm.mountPath.replace(/\/+$/, '');
    if (p === mp || p.startsWith(`${mp}/`)) {
      if (!best || mp.length > best.mountPath.replace(/\/+$/, '').length) best = vm;
    }
  }
  return best;
}

function rel(vm, p) {
  return path.posix.relative(vm.mountPath, p);
}

class Checker {
  constructor(opts) {
    this.opts = opts;
    this.problems = [];
  }

  fail(m, pointer, message) {
    this.problems.push(m.error(pointer, message));
  }

  // Each relay container: {m, pointer, pod, container, namespace}.
  relayContainers(manifests) {
    const out = [];
    for (const m of manifests) {
      const v = m.value;
      if (!v || !WORKLOADS.has(v.kind)) continue;
      const podPointer = v.kind === 'Pod' ? '/spec' : '/spec/template/spec';
      const pod = v.kind === 'Pod' ? v.spec : v.spec && v.spec.template && v.spec.template.spec;
      if (!pod) continue;
      for (const list of ['initContainers', 'containers']) {
        (pod[list] || []).forEach((c, i) => {
          const cmd = (c.command && c.command[0]) || '';
          if (path.posix.basename(cmd) !== 'dcr-relay') return;
          out.push({
            m,
            pointer: `${podPointer}/${list}/${i}`,
            podPointer,
            pod,
            container: c,
            namespace: (v.metadata && v.metadata.namespace) || 'default',
          });
        });
      }
    }
    return out;
  }

  find(manifests, kind, namespace, name) {
    return manifests.find(
      (x) =>
        x.value &&
        x.value.kind === kind &&
        x.value.metadata &&
        x.value.metadata.name === name &&
        (x.value.metadata.namespace || 'default') === namespace,
    );
  }

  // What a Secret or ConfigMap volume shows at path `p` of the container:
  // {vm, vol, src, key, mode, kind} (key: the object's key; mode: the
  // file's permission bits), or {error}.
  projected(r, p) {
    const vm = mountOf(r.container, p);
    if (!vm) return { error: `${p} is on no volume` };
    const vol = (r.pod.volumes || []).find((x) => x.name === vm.name);
    if (!vol) return { error: `volume ${vm.name} is not in the pod` };
    const src = vol.secret || vol.configMap;
    if (!src) return { vm, vol, error: `${p} is on volume ${vm.name}, not a Secret or ConfigMap` };
    const file = rel(vm, p);
    let key = file;
    let mode = src.defaultMode === undefined ? 0o644 : src.defaultMode;
    if (src.items) {
      const item = src.items.find((it) => it.path === file);
      if (!item) return { vm, vol, error: `volume ${vm.name} has no item with path ${file}` };
      key = item.key;
      if (item.mode !== undefined) mode = item.mode;
    }
    return { vm, vol, src, key, mode, kind: vol.secret ? 'Secret' : 'ConfigMap' };
  }

  // The topology the container mounts, checked by `dcr topo validate`:
  // {text, topo (dcr topo show's JSON), cm, key}, or null.
  topology(r, manifests, topoPath) {
    const { m } = r;
    const pr = this.projected(r, topoPath);
    if (pr.error || pr.kind !== 'ConfigMap') {
      this.fail(m, r.pointer, `--topology ${topoPath}: ${pr.error || 'not on a ConfigMap volume'}`);
      return null;
    }
    const cm = this.find(manifests, 'ConfigMap', r.namespace, pr.src.name);
    if (!cm) {
      this.fail(m, r.pointer, `--topology: no ConfigMap ${pr.src.name} in namespace ${r.namespace} among the manifests`);
      return null;
    }
    const text = cm.value.data && cm.value.data[pr.key];
    if (typeof text !== 'string') {
      this.fail(cm, '/data', `no key ${pr.key} (the topology ${topoPath} of ${m.label})`);
      return null;
    }
    const tmp = fs.mkdtempSync(path.join(TMP, 'dcr-k8s-topo.'));
    try {
      const f = path.join(tmp, 'topology.yaml');
      fs.writeFileSync(f, text);
      const val = spawnSync(this.opts.dcr, ['topo', 'validate', f], { encoding: 'utf8' });
      if (val.status !== 0) {
        this.fail(cm, `/data/${pr.key}`, `dcr topo validate: ${(val.stderr || val.stdout).trim()}`);
        return null;
      }
      const show = spawnSync(this.opts.dcr, ['topo', 'show', f, '-o', 'json'], { encoding: 'utf8' });
      if (show.status !== 0) {
        this.fail(cm, `/data/${pr.key}`, `dcr topo show: ${show.stderr.trim()}`);
        return null;
      }
      return { text, topo: JSON.parse(show.stdout).topology, cm, key: pr.key };
    } finally {
      fs.rmSync(tmp, { recursive: true, force: true });
    }
  }

  // The static checks of one relay container. Returns what the run needs,
  // or null when a check failed.
  check(r, manifests) {
    const before = this.problems.length;
    const { m, pod, container: c } = r;
    const P = r.pointer;
    const PP = r.podPointer;
    const fail = (pointer, msg) => this.fail(m, pointer, msg);

    // The environment the kubelet gives the container.
    const env = {};
    let nodeNameVar = null;
    for (const e of c.env || []) {
      if (e.value !== undefined) env[e.name] = String(e.value);
      else if (e.valueFrom && e.valueFrom.fieldRef) {
        env[e.name] = `<${e.valueFrom.fieldRef.fieldPath}>`;
        if (e.valueFrom.fieldRef.fieldPath === 'spec.nodeName') nodeNameVar = e.name;
      }
    }
    const rawArgs = c.args || [];
    for (const [i, a] of rawArgs.entries()) {
      const left = expand(a, env).match(/\$\(([^)]*)\)/);
      if (left) fail(`${P}/args/${i}`, `$(${left[1]}) is not an environment variable of the container`);
    }
    const { options } = parseArgs(rawArgs);
    const opt = (name) => {
      const v = options.get(name);
      return v === true ? undefined : v;
    };

    if (pod.hostNetwork !== true) {
      fail(`${PP}/hostNetwork`, 'must be true: a relay listens on its node\'s address and its peers accept it by that address');
    }
    const shmMount = (c.volumeMounts || []).find((vm) => vm.mountPath.replace(/\/+$/, '') === '/dev/shm');
    const shmVolume = shmMount && (pod.volumes || []).find((v) => v.name === shmMount.name);
    const shmIsMemory = !!(shmVolume && shmVolume.emptyDir && shmVolume.emptyDir.medium === 'Memory');
    if (pod.hostIPC !== true && !shmIsMemory) {
      fail(`${PP}/hostIPC`, 'must be true, unless /dev/shm is a memory emptyDir: the pod\'s own /dev/shm is a small tmpfs that a new pod starts empty');
    }
    if (pod.securityContext && pod.securityContext.fsGroup !== undefined) {
      fail(`${PP}/securityContext/fsGroup`, 'gives Secret files group read access, and the relay refuses a key file others can read');
    }
    const tgps = pod.terminationGracePeriodSeconds;
    if (!(Number.isInteger(tgps) && tgps >= 30)) {
      fail(`${PP}/terminationGracePeriodSeconds`, 'set it to at least 30: after SIGTERM the relay restores the base of a refit in progress and writes its store back');
    }
    const user =
      (c.securityContext && c.securityContext.runAsUser) !== undefined
        ? c.securityContext.runAsUser
        : pod.securityContext && pod.securityContext.runAsUser;
    if (user !== 0) {
      fail(`${P}/securityContext/runAsUser`, 'must be 0: Secret files are root\'s, and the key file must not be readable by a group');
    }

    // The node: --node=$(NODE_NAME), NODE_NAME from spec.nodeName.
    const node = opt('--node') || opt('-n');
    if (!nodeNameVar) fail(`${P}/env`, 'no variable from fieldRef spec.nodeName');
    if (node !== `$(${nodeNameVar || 'NODE_NAME'})`) {
      fail(`${P}/args`, `--node must be $(${nodeNameVar || 'NODE_NAME'}), the Kubernetes node name`);
    }

    // The topology and the cluster the pod's nodes are.
    const topoPath = opt('--topology') || opt('-t');
    if (!topoPath) {
      fail(`${P}/args`, 'no --topology');
      return null;
    }
    const t = this.topology(r, manifests, topoPath);
    if (!t) return null;
    const clusterName = pod.nodeSelector && pod.nodeSelector['dcr/cluster'];
    const cluster = t.topo.clusters.find((x) => x.name === clusterName);
    if (!cluster || !(cluster.nodes || []).length) {
      fail(`${PP}/nodeSelector`, `dcr/cluster must name a cluster of the topology with relays (${t.topo.clusters.filter((x) => (x.nodes || []).length).map((x) => x.name).join(', ')}), not ${JSON.stringify(clusterName)}`);
      return null;
    }
    const nodes = cluster.nodes;

    // Memory: limit >= --memory-limit + memory emptyDirs' sizeLimits.
    const ml = opt('--memory-limit');
    const mlBytes = ml !== undefined ? parseDcrSize(ml) : null;
    if (ml === undefined) {
      fail(`${P}/args`, 'needs --memory-limit SIZE (e.g. 1GiB): the container\'s memory limit is sized from it');
    } else if (!mlBytes) {
      fail(`${P}/args`, `--memory-limit ${ml}: not a size like 1GiB`);
    }
    let tmpfs = 0;
    const tmpfsNames = [];
    for (const vm of c.volumeMounts || []) {
      const vol = (pod.volumes || []).find((v) => v.name === vm.name);
      if (!vol || !vol.emptyDir || vol.emptyDir.medium !== 'Memory') continue;
      const i = pod.volumes.indexOf(vol);
      const size = vol.emptyDir.sizeLimit === undefined ? null : parseQuantity(vol.emptyDir.sizeLimit);
      if (size === null) {
        fail(`${PP}/volumes/${i}/emptyDir`, 'a memory emptyDir needs a sizeLimit: its files count against the container\'s memory limit');
        continue;
      }
      tmpfs += size;
      tmpfsNames.push(`${vm.name} ${vol.emptyDir.sizeLimit}`);
    }
    const res = c.resources || {};
    const limit = res.limits && res.limits.memory !== undefined ? parseQuantity(res.limits.memory) : null;
    const request = res.requests && res.requests.memory !== undefined ? parseQuantity(res.requests.memory) : null;
    if (limit === null) {
      fail(`${P}/resources/limits`, 'needs a memory limit');
    } else if (mlBytes && limit < mlBytes + tmpfs) {
      fail(
        `${P}/resources/limits/memory`,
        `${res.limits.memory} is below --memory-limit ${ml}${tmpfsNames.length ? ` + the memory emptyDir(s) ${tmpfsNames.join(' + ')}` : ''} = ${mib(mlBytes + tmpfs)}`,
      );
    }
    if (limit !== null && request !== null && request > limit) {
      fail(`${P}/resources/requests/memory`, 'is above the limit');
    }

    // Probes.
    const ready = opt('--ready-file');
    if (!ready || !ready.startsWith('/')) {
      fail(`${P}/args`, 'needs --ready-file with an absolute path (the readiness probe tests it)');
    } else if (mountOf(c, ready)) {
      fail(`${P}/args`, `--ready-file ${ready} is on volume ${mountOf(c, ready).name}: the relay does not remove it when it exits, so after a restart it would say ready before the relay listens; keep it on the container's own file system`);
    }
    for (const probe of ['readinessProbe', 'startupProbe']) {
      const pr = c[probe];
      if (!pr) {
        if (probe === 'readinessProbe') fail(`${P}`, 'no readinessProbe');
        continue;
      }
      if (!pr.exec || !Array.isArray(pr.exec.command) || !pr.exec.command.includes(ready)) {
        fail(`${P}/${probe}`, `must be an exec probe that tests the ready file ${ready} (test -s FILE)`);
      }
    }
    const metricsArg = opt('--metrics-port');
    const live = c.livenessProbe;
    let livePort = null;
    if (!live || !live.httpGet) {
      fail(`${P}`, 'needs a livenessProbe httpGet on the metrics port');
    } else {
      if (live.httpGet.path !== '/metrics') {
        fail(`${P}/livenessProbe/httpGet/path`, 'must be /metrics: the metrics endpoint answers nothing else');
      }
      livePort = live.httpGet.port;
      if (typeof livePort === 'string') {
        const named = (c.ports || []).find((p) => p.name === livePort);
        if (!named) fail(`${P}/livenessProbe/httpGet/port`, `no container port named ${livePort}`);
        livePort = named ? named.containerPort : null;
      }
    }
    const declared = new Set((c.ports || []).filter((p) => (p.protocol || 'TCP') === 'TCP').map((p) => p.containerPort));
    for (const n of nodes) {
      const mp = metricsArg !== undefined ? Number(metricsArg) : n.metrics_port;
      if (!mp) {
        fail(`${P}/args`, `node ${n.name} serves no metrics: give it metrics_port in the topology or --metrics-port`);
      } else if (livePort !== null && mp !== livePort) {
        fail(`${P}/livenessProbe/httpGet/port`, `is ${livePort}, node ${n.name}'s metrics port is ${mp}`);
      }
      for (const [what, port] of [['relay', n.port], ['metrics', mp]]) {
        if (port && !declared.has(port)) {
          fail(`${P}/ports`, `does not declare node ${n.name}'s ${what} port ${port} (TCP)`);
        }
      }
    }

    // Keys.
    const keyFile = opt('--auth-key-file') || t.topo.defaults.auth_key_file;
    const pubFile = opt('--signing-public-key-file') || t.topo.defaults.signing_public_key_file;
    const files = [];
    for (const [flag, file, secret] of [
      ['--auth-key-file', keyFile, true],
      ['--signing-public-key-file', pubFile, false],
    ]) {
      if (!file) {
        fail(`${P}/args`, `no ${flag} (nor its topology default)`);
        continue;
      }
      const pr = this.projected(r, file);
      if (pr.error) {
        fail(`${P}/args`, `${flag} ${file}: ${pr.error}`);
        continue;
      }
      if (secret && pr.kind !== 'Secret') {
        fail(`${P}/args`, `${flag} ${file} must be on a Secret volume`);
        continue;
      }
      if (secret && (pr.mode & 0o077) !== 0) {
        fail(`${PP}/volumes/${pod.volumes.indexOf(pr.vol)}/secret`, `the key file's mode is 0${pr.mode.toString(8)}: the relay refuses a key file group or others can read (defaultMode 256 is 0400)`);
      }
      const obj = this.find(manifests, pr.kind, r.namespace, pr.src.secretName || pr.src.name);
      if (!obj) {
        fail(`${P}/args`, `${flag}: no ${pr.kind} ${pr.src.secretName || pr.src.name} in namespace ${r.namespace} among the manifests`);
      } else if (!((obj.value.data && pr.key in obj.value.data) || (obj.value.stringData && pr.key in obj.value.stringData))) {
        fail(`${P}/args`, `${flag} ${file}: ${pr.kind} ${obj.value.metadata.name} has no key ${pr.key}`);
      }
      files.push({ flag, file, mode: pr.mode });
    }

    // The store: on a volume, or in a /dev/shm the pod shares.
    const storeArg = opt('--store');
    const stores = storeArg
      ? [{ node: '(--store)', spec: storeArg }]
      : nodes.map((n) => ({
          node: n.name,
          spec: n.store ? `${n.store.kind}:${n.store.path || ''}` : 'memory:',
        }));
    const undo = opt('--undo-dir');
    for (const s of stores) {
      const [kind, ...rest] = s.spec.split(':');
      const p = rest.join(':');
      if (kind === 'file') {
        const vm = mountOf(c, p);
        const vol = vm && (pod.volumes || []).find((v) => v.name === vm.name);
        if (!vol || !(vol.hostPath || vol.emptyDir || vol.persistentVolumeClaim || vol.ephemeral)) {
          fail(`${P}/volumeMounts`, `node ${s.node}'s store ${s.spec} is on no hostPath, emptyDir or persistent volume: the container's own file system loses it at every restart`);
        }
      } else if (kind === 'shm') {
        if (!(pod.hostIPC === true && !shmMount) && !shmIsMemory) {
          fail(`${PP}`, `node ${s.node}'s store ${s.spec} needs hostIPC (and no /dev/shm mount) or a memory emptyDir at /dev/shm`);
        }
        const u = undo && mountOf(c, undo);
        const uvol = u && (pod.volumes || []).find((v) => v.name === u.name);
        if (!uvol || (uvol.emptyDir && uvol.emptyDir.medium === 'Memory')) {
          fail(`${P}/args`, `node ${s.node}'s store ${s.spec} is in memory: give --undo-dir on a disk volume (a full refit's journal holds up to the store's size)`);
        }
      } else {
        fail(`${P}/args`, `node ${s.node}'s store ${s.spec}: use a file or shm store (a memory store is gone at every restart)`);
      }
    }

    // A serving socket: in a volume another container of the pod mounts.
    const sock = opt('--serving-socket');
    if (sock) {
      const vm = mountOf(c, sock);
      const others = [...(pod.initContainers || []), ...(pod.containers || [])].filter((x) => x !== c);
      const server = vm && others.find((x) => (x.volumeMounts || []).some((o) => o.name === vm.name));
      if (!server) {
        fail(`${P}/args`, `--serving-socket ${sock}: its directory must be a volume that the serving container mounts too`);
      } else if (shmIsMemory && !(server.volumeMounts || []).some((o) => o.name === shmMount.name && o.mountPath === shmMount.mountPath)) {
        fail(`${PP}`, `container ${server.name} does not mount the relay's /dev/shm (volume ${shmMount.name}), where the store is`);
      }
    }

    if (this.problems.length > before) return null;
    return { r, t, nodes, options, rawArgs, env, nodeNameVar, ready, files, livePort, shmIsMemory };
  }
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

function httpGet(port, p) {
  return new Promise((resolve) => {
    const req = http.get({ host: '127.0.0.1', port, path: p, timeout: 3000 }, (res) => {
      let body = '';
      res.on('data', (d) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode, body }));
    });
    req.on('error', (e) => resolve({ status: 0, body: String(e) }));
    req.on('timeout', () => req.destroy(new Error('timeout')));
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Writes `files` ({name: Buffer|string}) into dir as the kubelet's atomic
// writer lays out a Secret or ConfigMap volume: the files in a timestamped
// directory, ..data a symlink to it, and each name a symlink into ..data.
function atomicVolume(dir, files, modeOf) {
  const stamp = path.join(dir, '..2024_01_01_00_00_00.000000000');
  fs.mkdirSync(stamp, { recursive: true });
  for (const [name, content] of Object.entries(files)) {
    const f = path.join(stamp, name);
    fs.mkdirSync(path.dirname(f), { recursive: true });
    fs.writeFileSync(f, content);
    fs.chmodSync(f, modeOf(name));
  }
  fs.symlinkSync(path.basename(stamp), path.join(dir, '..data'));
  for (const name of Object.keys(files)) {
    const top = name.split('/')[0];
    if (!fs.existsSync(path.join(dir, top))) fs.symlinkSync(path.join('..data', top), path.join(dir, top));
  }
}

// Runs one relay container as the first node of its cluster.
async function runRelay(checker, plan, manifests) {
  const { r, nodes } = plan;
  const { m, pod, container: c } = r;
  const fail = (msg) => checker.fail(m, r.pointer, msg);
  const node = nodes[0];
  const T = fs.mkdtempSync(path.join(TMP, 'dcr-k8s.'));
  const root = path.join(T, 'root');
  const shmName = `/dcr-k8s-test-${process.pid}-${path.basename(T).split('.').pop()}`;
  const inRoot = (p) => path.join(root, p);
  let child = null;
  try {
    // The volumes.
    const keyFiles = new Map(plan.files.map((f) => [f.file, f.flag]));
    for (const vm of c.volumeMounts || []) {
      const vol = (pod.volumes || []).find((v) => v.name === vm.name);
      if (!vol || vm.mountPath.replace(/\/+$/, '') === '/dev/shm') continue;
      const dir = inRoot(vm.mountPath);
      fs.mkdirSync(dir, { recursive: true });
      const src = vol.secret || vol.configMap;
      if (!src) continue;
      const obj = checker.find(manifests, vol.secret ? 'Secret' : 'ConfigMap', r.namespace, src.secretName || src.name);
      const data = (obj && obj.value.data) || {};
      const keys = src.items ? src.items.map((it) => [it.key, it.path, it.mode]) : Object.keys(data).map((k) => [k, k, undefined]);
      const files = {};
      const modes = {};
      for (const [key, p, mode] of keys) {
        const full = path.posix.join(vm.mountPath, p);
        const flag = keyFiles.get(full);
        if (flag === '--auth-key-file') files[p] = crypto.randomBytes(32);
        else if (flag === '--signing-public-key-file') {
          const priv = path.join(T, 'root.key');
          const pub = path.join(T, 'root.pub');
          const kg = spawnSync(checker.opts.dcr, ['keygen', '--private', priv, '--public', pub], { encoding: 'utf8' });
          if (kg.status !== 0) throw new Error(`dcr keygen: ${kg.stderr}`);
          files[p] = fs.readFileSync(pub);
        } else files[p] = vol.secret ? Buffer.from(String(data[key] || ''), 'base64') : String(data[key] || '');
        modes[p] = mode !== undefined ? mode : src.defaultMode !== undefined ? src.defaultMode : 0o644;
      }
      atomicVolume(dir, files, (p) => modes[p]);
    }
    fs.mkdirSync(path.dirname(inRoot(plan.ready)), { recursive: true });

    // The topology the relay reads: the node moved to loopback and free
    // ports, its store under the temporary root (or a shm name of its own).
    const topoArg = plan.options.get('--topology') || plan.options.get('-t');
    const topoFile = inRoot(topoArg);
    const relayPort = await freePort();
    const metricsPort = await freePort();
    const storeArg = plan.options.get('--store');
    const sets = [`nodes.${node.name}.host=127.0.0.1`, `nodes.${node.name}.port=${relayPort}`];
    if (plan.options.get('--metrics-port') === undefined) sets.push(`nodes.${node.name}.metrics_port=${metricsPort}`);
    if (!storeArg) {
      sets.push(
        node.store.kind === 'shm'
          ? `nodes.${node.name}.store=shm:${shmName}`
          : `nodes.${node.name}.store=file:${inRoot(node.store.path)}`,
      );
    }
    const set = spawnSync(checker.opts.dcr, ['topo', 'set', topoFile, ...sets], { encoding: 'utf8' });
    if (set.status !== 0) throw new Error(`dcr topo set ${sets.join(' ')}: ${set.stderr}`);

    // The arguments as the kubelet expands them, with the paths moved.
    const env = { ...plan.env, [plan.nodeNameVar]: node.name };
    const moved = (name, value) => {
      if (name === '--metrics-port') return String(metricsPort);
      if (name === '--store') {
        return value.startsWith('shm:') ? `shm:${shmName}` : `file:${inRoot(value.slice(5))}`;
      }
      return value.startsWith('/') ? inRoot(value) : value;
    };
    const args = [];
    const raw = plan.rawArgs.map((a) => expand(a, env));
    for (let i = 0; i < raw.length; i++) {
      const a = raw[i];
      const eq = a.indexOf('=');
      if (a.startsWith('--') && eq > 0) {
        args.push(`${a.slice(0, eq)}=${moved(a.slice(0, eq), a.slice(eq + 1))}`);
      } else if (a.startsWith('-') && i + 1 < raw.length && !raw[i + 1].startsWith('-')) {
        args.push(a, moved(a, raw[++i]));
      } else {
        args.push(a);
      }
    }
    const probeCmd = (cmd) => cmd.map((x) => (x.startsWith('/') && x !== '/metrics' ? inRoot(x) : x));

    // --doctor with the same arguments.
    const doc = spawnSync(checker.opts.relay, [...args, '--doctor'], { encoding: 'utf8', timeout: 10000 });
    if (doc.status !== 0) fail(`dcr-relay ${args.join(' ')} --doctor exited ${doc.status}: ${doc.stderr.trim()}`);

    // Start it; the readiness probe must pass.
    const log = path.join(T, 'relay.log');
    const logFd = fs.openSync(log, 'w');
    child = spawn(checker.opts.relay, args, { stdio: ['ignore', logFd, logFd], env: { ...process.env, ...env } });
    fs.closeSync(logFd);
    let exited = null;
    child.on('exit', (code, sig) => (exited = { code, sig }));
    const readiness = probeCmd(c.readinessProbe.exec.command);
    let readyOk = false;
    const deadline = Date.now() + 10000;
    while (!exited && Date.now() < deadline) {
      if (spawnSync(readiness[0], readiness.slice(1)).status === 0) {
        readyOk = true;
        break;
      }
      await sleep(20);
    }
    const tail = () => fs.readFileSync(log, 'utf8').trim().split('\n').slice(-5).join(' | ');
    if (!readyOk) {
      fail(`the readiness probe (${readiness.join(' ')}) did not pass within 10 s as node ${node.name}${exited ? `; dcr-relay exited ${exited.code}` : ''}: ${tail()}`);
      return;
    }
    if (c.startupProbe && spawnSync(probeCmd(c.startupProbe.exec.command)[0], probeCmd(c.startupProbe.exec.command).slice(1)).status !== 0) {
      fail('the startup probe fails while the readiness probe passes');
    }
    const info = JSON.parse(fs.readFileSync(inRoot(plan.ready), 'utf8'));
    if (info.node !== node.name || info.port !== relayPort || info.metrics_port !== metricsPort) {
      fail(`ready file ${JSON.stringify(info)}: want node ${node.name}, port ${relayPort}, metrics_port ${metricsPort}`);
    }
    const got = await httpGet(metricsPort, c.livenessProbe.httpGet.path);
    if (got.status !== 200 || !got.body.includes('dcr_relay_')) {
      fail(`the liveness probe's GET ${c.livenessProbe.httpGet.path} answered ${got.status}: ${got.body.slice(0, 200)}`);
    }

    // SIGTERM: exit 0 well within the grace period.
    child.kill('SIGTERM');
    const grace = Math.min(10, pod.terminationGracePeriodSeconds || 30);
    const stopBy = Date.now() + grace * 1000;
    while (!exited && Date.now() < stopBy) await sleep(20);
    if (!exited) {
      fail(`dcr-relay still runs ${grace} s after SIGTERM`);
    } else if (exited.code !== 0) {
      fail(`dcr-relay exited ${exited.code}${exited.sig ? ` (${exited.sig})` : ''} after SIGTERM, want 0: ${tail()}`);
    } else {
      child = null;
      process.stdout.write(`check_relays.js: ${m.file} ${m.label} container ${c.name}: ran as node ${node.name}: ready, /metrics 200, exit 0 on SIGTERM\n`);
    }
  } catch (e) {
    fail(`running it: ${e.message}`);
  } finally {
    if (child) child.kill('SIGKILL');
    for (const f of fs.existsSync('/dev/shm') ? fs.readdirSync('/dev/shm') : []) {
      if (f.startsWith(shmName.slice(1))) fs.rmSync(path.join('/dev/shm', f), { force: true });
    }
    if (process.env.DCR_K8S_KEEP) process.stdout.write(`check_relays.js: kept ${T}\n`);
    else fs.rmSync(T, { recursive: true, force: true });
  }
}

async function main(argv) {
  const opts = { dcr: null, relay: null, static: false, paths: [] };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--dcr') opts.dcr = argv[++i];
    else if (argv[i] === '--dcr-relay') opts.relay = argv[++i];
    else if (argv[i] === '--static') opts.static = true;
    else opts.paths.push(argv[i]);
  }
  if (!opts.dcr || !opts.relay || !opts.paths.length) {
    process.stderr.write('usage: node tools/k8s/check_relays.js --dcr DCR --dcr-relay DCR_RELAY [--static] DIR\n');
    return 2;
  }
  const { manifests, errors } = loadFiles(expandPaths(opts.paths));
  const checker = new Checker(opts);
  checker.problems.push(...errors);
  const relays = checker.relayContainers(manifests);
  if (!relays.length) checker.problems.push(`${opts.paths.join(' ')}: no container runs dcr-relay`);
  const plans = [];
  for (const r of relays) {
    const plan = checker.check(r, manifests);
    if (plan) plans.push(plan);
  }
  if (!opts.static && !checker.problems.length) {
    for (const plan of plans) await runRelay(checker, plan, manifests);
  }
  if (checker.problems.length) {
    for (const p of checker.problems) process.stderr.write(`${p}\n`);
    process.stderr.write(`check_relays.js: ${checker.problems.length} problem(s)\n`);
    return 1;
  }
  process.stdout.write(`check_relays.js: ${relays.length} dcr-relay container(s) pass\n`);
  return 0;
}

main(process.argv.slice(2)).then(
  (rc) => (process.exitCode = rc),
  (e) => {
    process.stderr.write(`check_relays.js: ${e.stack}\n`);
    process.exitCode = 1;
  },
);
