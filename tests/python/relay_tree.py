"""The relay tree of producer_trainer_test.py --refit: two dcr-relay
processes on loopback under a `dcr refit --producers` coordinator, and the
helpers it needs (a canonical safetensors writer, free ports, `dcr verify`).
"""
import ctypes
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time

import torch

SPAN = 64  # elements per span: small, so tensors have several

def check(ok, what):
    if not ok:
        raise AssertionError(what)


def bits(t):
    return t.contiguous().view(-1).view(torch.uint8)

ST_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16",
             torch.float32: "F32", torch.float64: "F64", torch.int8: "I8",
             torch.int16: "I16", torch.int32: "I32", torch.int64: "I64",
             torch.uint8: "U8", torch.bool: "BOOL"}


def write_safetensors(path, tensors):
    """A canonical checkpoint with the standard library: the 8-byte
    little-endian header length, the JSON header and the data, both in
    canonical order (bytewise by name), the header padded with spaces to a
    multiple of 8 bytes; written to a temporary file renamed into place."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors, key=lambda n: n.encode()):
        t = tensors[name]
        b = bits(t).numpy().tobytes()
        header[name] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.rename(tmp, path)


def free_ports(n):
    """n distinct ports free now, from below the kernel's ephemeral range
    (as tests/integration/lib.sh free_ports picks them)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        lo = max(int(f.read().split()[0]), 12000)
    socks = []
    try:
        for port in random.sample(range(10000, lo), lo - 10000):
            if len(socks) == n:
                break
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
                socks.append(s)
            except OSError:
                s.close()
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def die_with_parent():
    """SIGKILL when the test process dies (in a relay or the coordinator
    before exec, in a forked rank), so that nothing outlives a test killed
    by its timeout."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class RelayTree:
    """Two dcr-relay processes (a, b) on loopback under a root whose
    coordinator, `dcr refit --producers`, takes the trainer ranks' streams.
    The test process owns them: start() once rank 0 wrote the reference
    export of the initial weights (d/ref/v0.safetensors), finish() when the
    ranks are done, kill() on every path out."""

    RELAYS = ("a", "b")

    def __init__(self, d, dcr_bin, relay_bin, par, steps):
        self.d, self.dcr, self.relay = d, dcr_bin, relay_bin
        self.par, self.steps = par, steps
        self.procs = {}  # name -> Popen; "coord" is the coordinator
        ports = free_ports(4)
        if len(ports) != 4:
            raise RuntimeError("could not pick free ports")
        self.coordinator = f"127.0.0.1:{ports[3]}"
        self.layout = os.path.join(d, "layout.yaml")
        self.topology = os.path.join(d, "tree.yaml")
        os.makedirs(os.path.join(d, "ref"))
        with open(self.topology, "w") as f:
            f.write(f"""version: 1
defaults: {{transport: tcp, fanout: 2, span_elems: {SPAN}}}
root: {{name: trainer, host: 127.0.0.1, port: {ports[0]}, cluster: train, state_dir: "{d}/state", baseline: "{self.store('root')}"}}
clusters:
  - name: train
  - name: rollout
    nodes:
      - {{name: a, host: 127.0.0.1, port: {ports[1]}, store: {{kind: file, path: "{self.store('a')}"}}}}
      - {{name: b, host: 127.0.0.1, port: {ports[2]}, store: {{kind: file, path: "{self.store('b')}"}}}}
links:
  - {{from: train, to: rollout, bandwidth: 1Gbps, latency: 1ms}}
""")

    def store(self, name):
        return os.path.join(self.d, f"{name}.safetensors")

    def log(self, name):
        return os.path.join(self.d, f"{name}.log")

    def reference(self, step):
        return os.path.join(self.d, "ref", f"v{step}.safetensors")

    def stores(self):
        return [self.store(n) for n in self.RELAYS + ("root",)]

    def tail(self, name):
        try:
            with open(self.log(name), errors="replace") as f:
                return f"--- {name}.log:\n" + f.read()[-4000:]
        except OSError:
            return ""

    def spawn(self, name, argv, stdout):
        with open(self.log(name), "ab") as err:
            self.procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=err,
                preexec_fn=die_with_parent)

    def start(self):
        for n in self.RELAYS + ("root",):
            shutil.copyfile(self.reference(0), self.store(n))
        for n in self.RELAYS:
            ready = os.path.join(self.d, f"{n}.ready")
            self.spawn(n, [self.relay, "--topology", self.topology, "--node",
                           n, "--ready-file", ready], subprocess.DEVNULL)
        for n in self.RELAYS:
            self.wait_for(n, lambda: os.path.getsize(
                os.path.join(self.d, f"{n}.ready")) > 0, "ready")
        with open(os.path.join(self.d, "coord.out"), "wb") as out:
            self.spawn("coord", [
                self.dcr, "refit", "--topology", self.topology,
                "--producers", str(self.par.world), "--layout", self.layout,
                "--listen", self.coordinator, "--refits", str(self.steps),
                "--timeout", "20s", "-o", "json", "--progress", "never"], out)

        def listening():
            with open(self.log("coord")) as f:
                return "waiting for" in f.read()
        self.wait_for("coord", listening, "listening")

    def wait_for(self, name, cond, what, within=10.0):
        end = time.monotonic() + within
        while time.monotonic() < end:
            try:
                if cond():
                    return
            except OSError:
                pass
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited {self.procs[name].returncode}"
                                   f" before it was {what}\n" + self.tail(name))
            time.sleep(0.02)
        raise RuntimeError(f"{name} not {what} within {within:g} s\n" +
                           self.tail(name))

    def finish(self):
        """The coordinator exits 0 after the last refit, having reported
        every step committed on every node; the relays exit 0 on SIGTERM."""
        coord = self.procs.pop("coord")
        try:
            rc = coord.wait(timeout=30)
        except subprocess.TimeoutExpired:
            coord.kill()
            coord.wait()
            raise RuntimeError("the coordinator did not exit after its "
                               f"{self.steps} refits\n" + self.tail("coord"))
        if rc != 0:
            raise RuntimeError(f"the coordinator exited {rc}, want 0\n" +
                               self.tail("coord"))
        with open(os.path.join(self.d, "coord.out")) as f:
            reports = [json.loads(l) for l in f if l.strip()]
        check([r["outcome"] for r in reports] == ["committed"] * self.steps,
              f"coordinator outcomes: {[r['outcome'] for r in reports]}")
        check([r["trainer_step"] for r in reports] ==
              list(range(1, self.steps + 1)),
              f"coordinator steps: {[r['trainer_step'] for r in reports]}")
        for r in reports:
            check(r["producers"] == self.par.world,
                  f"step {r['trainer_step']}: {r['producers']} producers")
            check(sorted(n["node"] for n in r["nodes"]) == list(self.RELAYS)
                  and all(n["committed"] for n in r["nodes"]),
                  f"step {r['trainer_step']}: nodes {r['nodes']}")
            check(r["chunks"] > 0 and r["changed_elements"] > 0,
                  f"step {r['trainer_step']}: no changes streamed")
        for n in self.RELAYS:
            p = self.procs.pop(n)
            p.send_signal(signal.SIGTERM)
            try:
                rc = p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                raise RuntimeError(f"relay {n} still running 5 s after "
                                   "SIGTERM\n" + self.tail(n))
            if rc != 0:
                raise RuntimeError(f"relay {n} exited {rc} after SIGTERM, "
                                   "want 0\n" + self.tail(n))
        return reports

    def kill(self):
        """On any path out: SIGKILL the coordinator, SIGTERM the relays and
        SIGKILL what is left after 5 s."""
        coord = self.procs.pop("coord", None)
        if coord is not None and coord.poll() is None:
            coord.kill()
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + 5
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if coord is not None:
            coord.wait()
        self.procs.clear()


def dcr_verify(dcr_bin, store, reference):
    r = subprocess.run([dcr_bin, "verify", "--progress", "never", store,
                        reference], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True)
    check(r.returncode == 0, f"dcr verify {store} {reference}: exit "
          f"{r.returncode}\n{r.stdout}{r.stderr}")
