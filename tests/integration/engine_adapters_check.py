"""Drives dcr's engine adapters (integrations/dcr_engines) against real
relays, through the call-order harness (engine_harness/README.md: not vLLM,
not SGLang). Run by engine_adapters_test.sh, which starts the relays and
seeds them with v0.

Usage: engine_adapters_check.py PYDIR REPO DCR TOPO CK SHM T STEPS
(CK: the checkpoints' prefix; CK-serve and CK-fp8 hold each version and
its serving ranks in the two layouts.)
"""

import json
import os
import subprocess
import sys
import time

PYDIR, REPO, DCR, TOPO, CK, SHM, T, STEPS = sys.argv[1:9]
STEPS = int(STEPS)
sys.path[:0] = [PYDIR, os.path.join(REPO, "integrations"),
                os.path.join(REPO, "tests/integration/engine_harness")]

import torch  # noqa: E402

import dcr_engines.sglang as dcr_sglang  # noqa: E402
import dcr_engines.vllm as dcr_vllm  # noqa: E402
from dcr_engines import StaleStepError  # noqa: E402
from drivers import SglangEngine, StandInModel, VllmWorker  # noqa: E402
from vllm.model_executor.model_loader import reload  # noqa: E402

DTYPES = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16,
          "U8": torch.uint8, "F8_E4M3": torch.uint8}


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def load(path):
    """name -> tensor of a .safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = bytearray(data[8 + n + a:8 + n + b])
        t = torch.frombuffer(raw, dtype=torch.uint8) if raw else \
            torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def rank_file(k, r, layout="serve"):
    """What serving rank r holds at v<k>, less the relay's shadows."""
    t = load(os.path.join(CK + "-" + layout, "v%d.shards" % k,
                          "rank-%05d.safetensors" % r))
    return {n: x for n, x in t.items() if not n.endswith(".shadow")}


def canonical(k):
    return load(os.path.join(CK + "-serve", "v%d.safetensors" % k))


def same(model, want, what):
    got = model.params
    if set(got) != set(want):
        fail("%s: names differ: %s" % (what, sorted(set(got) ^ set(want))[:5]))
    for name, t in want.items():
        a = got[name].contiguous().view(torch.uint8)
        b = t.contiguous().view(torch.uint8)
        if not torch.equal(a, b):
            fail("%s: tensor '%s' differs from the target's" % (what, name))


def refit(k):
    """Refits the tree to v<k>; returns the committed step."""
    p = subprocess.run([DCR, "refit", "--topology", TOPO, "--progress",
                        "never", "-o", "json", "--target",
                        os.path.join(CK + "-serve", "v%d.safetensors" % k)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        fail("dcr refit to v%d exited %d: %s%s" % (k, p.returncode, p.stdout,
                                                 p.stderr))
    out = json.loads(p.stdout)
    if out["outcome"] != "committed":
        fail("refit to v%d: %s" % (k, out["outcome"]))
    return out


def expect_raises(kind, text, fn):
    try:
        fn()
    except kind as e:
        if text not in str(e):
            fail("expected %s with '%s', got: %s" % (kind.__name__, text, e))
        return
    fail("expected %s with '%s'" % (kind.__name__, text))


def wait_for(cond, what, seconds=10.0):
    end = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > end:
            fail("timed out waiting for " + what)
        time.sleep(0.01)


dcr_vllm.register()
dcr_vllm.register()  # a second registration is harmless

# vLLM: two tensor-parallel workers on the serving stores ("direct"), and
# one on the canonical store ("load_weights").
vllm_direct = [VllmWorker("dcr", r, StandInModel(rank_file(0, r)))
               for r in (0, 1)]
for w in vllm_direct:
    w.init_weight_transfer_engine({
        "store": "shm:/%s-s{rank}" % SHM, "socket": T + "/s{rank}.sock",
        "mode": "direct", "wait_s": 30.0})
# FP8 codes in uint8 parameters: torch 1.13 has no float8 (the copy into
# a float8 parameter through a uint8 view is weight_source_test's).
vllm_fp8 = VllmWorker("dcr", 0, StandInModel(rank_file(0, 0, "fp8")))
vllm_fp8.init_weight_transfer_engine({
    "store": "shm:/%s-f{rank}" % SHM, "socket": T + "/f{rank}.sock",
    "mode": "direct", "wait_s": 30.0})
vllm_canon = VllmWorker("dcr", 0, StandInModel(canonical(0)))
vllm_canon.init_weight_transfer_engine({
    "store": "shm:/%s-c0" % SHM, "socket": T + "/c0.sock",
    "mode": "load_weights", "wait_s": 30.0})
# SGLang: two tensor-parallel ranks on the serving stores, following the
# relays' live headers (no socket: the vLLM workers answer those).
sglang = SglangEngine([StandInModel(rank_file(0, r)) for r in (0, 1)],
                      custom_weight_loader=[dcr_sglang.LOAD_FORMAT])

# Bad requests say what to fix.
bad = VllmWorker("dcr", 0, StandInModel({}))
expect_raises(ValueError, "mode 'bogus'", lambda: bad.init_weight_transfer_engine(
    {"store": "shm:/x", "mode": "bogus"}))
expect_raises(ValueError, "Invalid init_info", lambda: bad.init_weight_transfer_engine(
    {"stor": "shm:/x"}))
expect_raises(RuntimeError, "init_weight_transfer_engine first",
              bad.start_weight_update)
expect_raises(ValueError, "one tensor named 'dcr.request'",
              lambda: sglang.update_weights_from_tensor(
                  [("w", torch.zeros(1))], load_format=dcr_sglang.LOAD_FORMAT))

ptrs = {n: t.data_ptr() for n, t in vllm_direct[0].model.params.items()}
first = vllm_direct[0].engine.source.step
print("seeded: step %d" % first)


def update_vllm(worker, step, **extra):
    worker.start_weight_update()
    worker.update_weights(dict({"step": step}, **extra))
    worker.finish_weight_update()


def update_all(k, step):
    for w in vllm_direct:
        update_vllm(w, step)
        if w.engine.last["step"] != step:
            fail("vLLM rank %d loaded step %s" % (w.rank, w.engine.last))
        same(w.model, rank_file(k, w.rank),
             "vLLM direct rank %d at v%d" % (w.rank, k))
    update_vllm(vllm_fp8, step)
    same(vllm_fp8.model, rank_file(k, 0, "fp8"), "vLLM direct FP8 at v%d" % k)
    before = len(reload.calls)
    update_vllm(vllm_canon, step)
    if [c for c, _ in reload.calls[before:]] != [
            "initialize_layerwise_reload", "finalize_layerwise_reload"]:
        fail("load_weights mode: reload calls %s" % reload.calls[before:])
    same(vllm_canon.model, canonical(k), "vLLM load_weights at v%d" % k)
    sglang.update_weights_from_tensor(
        dcr_sglang.request(step, store="shm:/%s-s{rank}" % SHM, timeout_s=30),
        load_format=dcr_sglang.LOAD_FORMAT)
    for r, runner in enumerate(sglang.runners):
        same(runner.model, rank_file(k, r), "SGLang rank %d at v%d" % (r, k))


update_all(0, first)
for k in range(1, STEPS + 1):
    refit(k)
    update_all(k, first + k)
    print("v%d: step %d loaded by 2 vLLM direct ranks, a vLLM direct FP8 "
          "rank, vLLM load_weights, 2 SGLang ranks, bit for bit"
          % (k, first + k))
now = first + STEPS

# In place: the parameters kept their storage.
if {n: t.data_ptr() for n, t in vllm_direct[0].model.params.items()} != ptrs:
    fail("direct mode reallocated parameters")

# A step the trainer moved past, and one not committed yet.
w0 = vllm_direct[0]
w0.start_weight_update()
expect_raises(StaleStepError, "step %d was asked for" % (now - 1),
              lambda: w0.update_weights({"step": now - 1}))
w0.start_weight_update()
expect_raises(TimeoutError, "has not committed step %d" % (now + 1),
              lambda: w0.update_weights({"step": now + 1, "timeout_s": 0.3}))
expect_raises(ValueError, "Invalid update_info",
              lambda: (w0.start_weight_update(),
                       w0.update_weights({"stepp": now})))
expect_raises(ValueError, "needs the committed step",
              lambda: (w0.start_weight_update(), w0.update_weights({})))
# An update that fails after it loaded (a second update_weights for
# another step) ends without finish, as vLLM's worker ends it: the source
# lets go of its image all the same.
w0.start_weight_update()
w0.update_weights({"step": now})
expect_raises(RuntimeError, "an update holds step %d" % now,
              lambda: w0.update_weights({"step": now + 1}))
if w0.engine.source._held is not None:
    fail("a failed update left its image held")

# An update holds its image across a commit: the source stays on it, the
# relay writes the other, and the held image keeps the old bits.
held = rank_file(STEPS, 0)
w0.start_weight_update()
w0.update_weights({"step": now})
refit(STEPS + 1)
time.sleep(0.5)  # the relay tries the held image's lock every 50 ms
source = w0.engine.source
if source.step != now:
    fail("the source moved while an update held step %d" % now)
for name, t in source.tensors().items():
    if not torch.equal(t.contiguous().view(torch.uint8),
                       held[name].contiguous().view(torch.uint8)):
        fail("the held image changed under the update: '%s'" % name)
w0.finish_weight_update()
wait_for(lambda: source.step == now + 1, "the source to move after release")
update_all(STEPS + 1, now + 1)
print("an update held step %d across the commit of step %d; then loaded it"
      % (now, now + 1))

# trainer_send_weights: one dcr refit of a rank's shards through its
# dcr.Producer (a stand-in here: the producers' refit has its own tests).
class Producer:
    def __init__(self, outcome):
        self.outcome, self.got = outcome, None

    def refit(self, step, shards):
        self.got = (step, sorted(shards))
        return {"outcome": self.outcome, "committed": self.outcome ==
                "committed", "reason": "a node voted no"}


p = Producer("committed")
d = dcr_vllm.DcrWeightTransferEngine.trainer_send_weights(
    iter([("b", torch.zeros(1)), ("a", torch.ones(1))]),
    {"producer": p, "step": 9})
if p.got != (9, ["a", "b"]) or not d["committed"]:
    fail("trainer_send_weights: %s %s" % (p.got, d))
expect_raises(RuntimeError, "dcr refit of step 9: aborted: a node voted no",
              lambda: dcr_vllm.DcrWeightTransferEngine.trainer_send_weights(
                  iter([]), {"producer": Producer("aborted"), "step": 9}))

for w in vllm_direct + [vllm_fp8, vllm_canon]:
    w.shutdown()
    order = [c for c in w.calls if c != "update_weights"]
    if order[0] != "init_weight_transfer_engine" or order[-1] != "shutdown":
        fail("call order %s" % w.calls)
dcr_sglang.close()
print("ok: engine adapters (call-order harness, not vLLM or SGLang)")
