#!/usr/bin/env python3
"""The dcr_cuda Python module with torch CUDA tensors (docs/PYTHON.md
§"CUDA tensors"): digests computed on the device equal the host's, the GPU
diff equals torch's, chunks applied in process land bit for bit, and a
relay process (cuda_ipc_peer) applies a refit into this process's own
tensors, placed by torch's caching allocator, through CUDA IPC.

Exit 77 (skipped) without a CUDA device or a CUDA torch.

  cuda_tensors_test.py PEER    (dcr_cuda on PYTHONPATH)
"""
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import dcr_cuda
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

if not torch.cuda.is_available() or not dcr_cuda.devices():
    print("skipped: no CUDA device (torch.cuda.is_available() is "
          f"{torch.cuda.is_available()}, dcr_cuda.built() is {dcr_cuda.built()})")
    sys.exit(77)

PEER = sys.argv[1]
SPAN = 1 << 16
torch.manual_seed(20261204)
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def bf16_step(n, density):
    base = (torch.randn(n) * 0.02).to(torch.bfloat16)
    bits = base.view(torch.int16).clone()
    mask = torch.rand(n) < density
    bits[mask] ^= torch.randint(1, 4, (int(mask.sum()),), dtype=torch.int16)
    return base, bits.view(torch.bfloat16)


# Digests: device == host, for several dtypes and odd sizes.
for dtype, n in [(torch.bfloat16, 1_000_003), (torch.float32, 77), (torch.float16, 4096)]:
    t = torch.randn(n).to(dtype)
    check(dcr_cuda.tensor_digest(t.cuda()) == dcr_cuda.tensor_digest(t),
          f"tensor_digest of {dtype} x{n} on the GPU is the host's")

# The GPU diff against torch's.
base, target = bf16_step(3_000_001, 0.03)
pos, val = dcr_cuda.find_changes(base.cuda(), target.cuda())
want = (base.view(torch.int16) != target.view(torch.int16)).nonzero().flatten()
got = torch.frombuffer(bytearray(pos), dtype=torch.int32).long()
check(torch.equal(got, want), f"find_changes: {len(want)} positions as torch's")
xor = (base.view(torch.int16) ^ target.view(torch.int16))[want]
check(torch.equal(torch.frombuffer(bytearray(val), dtype=torch.int16), xor),
      "find_changes: XOR values as torch's")

# In process: chunks applied to a CUDA tensor.
chunks = dcr_cuda.encode_diff(base, target, SPAN)
dev = base.cuda()
applier = dcr_cuda.Applier(1 << 20)
for c in chunks:
    applier.apply(c, dev, SPAN)
applier.flush()
check(torch.equal(dev.cpu().view(torch.int16), target.view(torch.int16)),
      f"Applier: {len(chunks)} chunks land bit for bit in a CUDA tensor")

# Through CUDA IPC: this process serves, the peer applies.
with tempfile.TemporaryDirectory() as d:
    weights = {}
    targets = {}
    for name, n in [("model.embed.weight", 500_000), ("model.norm.weight", 4096),
                    ("lm_head.weight", 300_001)]:
        b, t = bf16_step(n, 0.05)
        weights[name] = b.cuda()          # the caching allocator places these
        targets[name] = t
        with open(os.path.join(d, name + ".chunks"), "wb") as f:
            for c in dcr_cuda.encode_diff(b, t, SPAN):
                f.write(c)
    torch.cuda.synchronize()
    sock = os.path.join(d, "ipc.sock")
    with dcr_cuda.Exporter(sock, weights) as ex:
        offsets = [e["offset"] for e in __import__("json").loads(ex.manifest)["tensors"]]
        print(f"     exported {len(weights)} tensors at allocation offsets {offsets}")
        out = subprocess.run([PEER, sock, d, str(SPAN)], capture_output=True,
                             text=True, timeout=120)
    check(out.returncode == 0, f"the relay process ran ({out.stderr.strip()})")
    digests = dict(line.split() for line in out.stdout.splitlines())
    torch.cuda.synchronize()
    for name, t in targets.items():
        check(torch.equal(weights[name].cpu().view(torch.int16), t.view(torch.int16)),
              f"IPC: {name} holds the target after the relay's apply")
        check(digests.get(name) == dcr_cuda.tensor_digest(t),
              f"IPC: the relay's device digest of {name} is the target's")

print(f"{len(failures)} failed" if failures else "all passed")
sys.exit(1 if failures else 0)
