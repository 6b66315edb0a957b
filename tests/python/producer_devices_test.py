#!/usr/bin/python3
"""dcr.ShardProducer and dcr.Producer handed tensors on a GPU (issue 20:
"the Python Receiver and Producer accept CUDA tensors"), on a machine
without one.

A CUDA tensor is taken as a span of its device's memory, and the producer
keeps its baseline there (cuda::CreateShardMemory). This machine's torch
has no CUDA, so the tensors here are stand-ins that answer what the module
asks of a torch CUDA tensor (is_cuda, device, data_ptr, ...). The checks:
such shards reach the GPU path and are refused there with the reason (no
GPU, or a build without CUDA), before any coordinator is contacted; shards
from two devices, non-contiguous ones, and shards from another device than
the baseline's are refused naming them; and host tensors still diff,
advance and give the same parts after the refusals. The GPU path itself
runs in tests/cuda (cuda_producer_test.cc) on a GPU machine.

Usage: producer_devices_test.py PYTHON_MODULE_DIR
"""
import os
import sys
import tempfile
import types

import torch

LAYOUT = """version: 1
parallel: {tp: 2}
layers: 1
tensors:
  - name: embed
    shard: emb
    split: vocab
    pad_to: 4
    shape: [50, 8]
  - name: l.{layer}.o
    shard: l.{layer}.proj
    split: row
    shape: [8, 8]
"""


class OnGpu:
    """What the module reads of a torch CUDA tensor, over a CPU tensor."""

    def __init__(self, t, contiguous=True, index=0):
        self._t = t
        self._contiguous = contiguous
        self.is_cuda = True
        self.device = types.SimpleNamespace(type="cuda", index=index)
        self.dtype = t.dtype
        self.shape = t.shape

    def is_contiguous(self):
        return self._contiguous

    def data_ptr(self):
        return self._t.data_ptr()

    def numel(self):
        return self._t.numel()

    def element_size(self):
        return self._t.element_size()

    def detach(self):  # the module holds a view, which holds the storage
        return OnGpu(self._t.detach(), self._contiguous, self.device.index)


def gpu_usable(dcr_cuda):
    try:
        return len(dcr_cuda.devices()) > 0
    except RuntimeError:
        return False


def expect(exc, text, fn):
    try:
        fn()
    except exc as e:
        if text not in str(e):
            sys.exit(f"FAIL: {exc.__name__} without {text!r}: {e}")
        return str(e)
    sys.exit(f"FAIL: no {exc.__name__} ({text!r})")


def main():
    sys.path.insert(0, sys.argv[1])
    import dcr
    import dcr_cuda

    # Where a GPU is usable the stand-ins (host pointers posing as device
    # ones) would reach the GPU: tests/cuda covers that machine.
    if torch.cuda.is_available() or (dcr_cuda.built() and gpu_usable(dcr_cuda)):
        print("skipped: a GPU is usable here; tests/cuda checks the GPU path")
        sys.exit(77)

    tmp = tempfile.mkdtemp(prefix="dcr-devices.")
    path = os.path.join(tmp, "layout.yaml")
    with open(path, "w") as f:
        f.write(LAYOUT)
    layout = dcr.Layout(path)
    rank = 1
    g = torch.Generator().manual_seed(3)
    base = {n: torch.randn(shape, generator=g).to(torch.bfloat16)
            for n, (shape, dtype) in layout.shards(rank).items()}
    target = {n: t.clone() for n, t in base.items()}
    target["l.0.proj"][0, 0] += 1

    # On a GPU: refused by the GPU path, saying why.
    gpu = {n: OnGpu(t) for n, t in base.items()}
    p = dcr.ShardProducer(layout, rank, span_elems=16)
    why = expect(RuntimeError, "cannot keep a producer's shards on cuda:0",
                 lambda: p.set_baseline(gpu))
    if ("no usable CUDA device" not in why and "no CUDA device" not in why
            and "without CUDA" not in why):
        sys.exit(f"FAIL: the refusal does not say why: {why}")
    print("GPU shards refused:", why)

    # Before the coordinator is contacted (nothing listens there).
    live = dcr.Producer(layout, rank, "127.0.0.1:9", connect_timeout_s=1.0)
    expect(RuntimeError, "cannot keep a producer's shards on cuda:0",
           lambda: live.refit(1, gpu))

    # Two devices in one dict, and a non-contiguous GPU tensor.
    mixed = dict(base)
    mixed["l.0.proj"] = OnGpu(base["l.0.proj"])
    expect(ValueError, "from one device", lambda: p.set_baseline(mixed))
    strided = {n: OnGpu(t, contiguous=(n != "emb")) for n, t in base.items()}
    expect(ValueError, "shard 'emb' is not contiguous",
           lambda: p.set_baseline(strided))
    # The layout's shape still checked first.
    wrong = dict(gpu)
    wrong["emb"] = OnGpu(base["emb"].reshape(-1))
    expect(ValueError, "needs a new layout", lambda: p.set_baseline(wrong))

    # Host tensors after the refusals: the producer works, and its baseline
    # stays on the CPU: GPU shards are refused while it holds it.
    p.set_baseline(base)
    expect(ValueError, "baseline is on the CPU, these shards on cuda:0",
           lambda: p.diff(gpu))
    step = p.diff(target)
    if step["changed"] != 1 or len(step["chunks"]) != 1:
        sys.exit(f"FAIL: one change expected: {step['changed']}, "
                 f"{len(step['chunks'])} chunks")
    p.advance(target)
    again = dcr.ShardProducer(layout, rank, span_elems=16)
    again.set_baseline(base)
    if again.diff(target)["chunks"] != step["chunks"]:
        sys.exit("FAIL: the parts differ from a fresh producer's")
    print("producer_devices_test: OK")


if __name__ == "__main__":
    main()
