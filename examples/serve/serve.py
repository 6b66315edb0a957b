#!/usr/bin/python3
"""One serving process of examples/serve: generates from its relay's store
and, at every version it moves to, checks its logits on a fixed prompt
against a model loaded from the target's rank file (written by
dcr-traingen through the same layout). Run by examples/serve/run.py.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--pydir", required=True)
p.add_argument("--store", required=True)
p.add_argument("--socket", required=True)
p.add_argument("--name", required=True)
p.add_argument("--rank", type=int, default=0)
p.add_argument("--world", type=int, default=1)
p.add_argument("--master-port", type=int, default=0)
p.add_argument("--reference", required=True, help="traingen dir: vK.shards/")
p.add_argument("--last-step", type=int, required=True)
p.add_argument("--out", required=True)
p.add_argument("--dims", required=True, help="layers,heads,kv_heads,head_dim,vocab")
p.add_argument("--fp8-block", type=int, default=0)
a = p.parse_args()

sys.path.insert(0, a.pydir)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcr  # noqa: E402
from model import Gpt, load_safetensors  # noqa: E402

torch.set_num_threads(1)
if a.world > 1:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.master_port}",
                            rank=a.rank, world_size=a.world)
layers, heads, kv_heads, head_dim, vocab = (int(x) for x in a.dims.split(","))
table = dcr.fp8_e4m3_table() if a.fp8_block else None
block = (a.fp8_block, a.fp8_block) if a.fp8_block else None


def model():
    return Gpt(layers, heads, kv_heads, head_dim, vocab, a.rank, a.world, table, block)


def agree(value):
    """The same value on every rank, else -1."""
    if a.world == 1:
        return value
    t = torch.tensor([value, -value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t[0]) if int(t[0]) == -int(t[1]) else -1


r = dcr.Receiver(a.store, socket=a.socket, wait=60.0)
gpt = model()
gpt.load(r.tensors())
prompt = torch.tensor([1, 17, 99, 3, 250, 7, 64, 2], dtype=torch.int64)
tokens = prompt.clone()
log = open(a.out, "a")
checked = set()
while True:
    # Answer the relay; move when every rank's next step is the same (a
    # rank that started late may already be there), and compute only when
    # every rank is on one step: an all-reduce never mixes two versions.
    r.poll(move=False)
    pending = r.pending_step()
    if agree(pending if pending is not None else r.step) >= 0 and pending is not None:
        if r.poll():  # False: the relay is mid-flip; the next turn moves
            gpt.load(r.tensors())
    if agree(r.step) < 0:
        time.sleep(0.002)
        continue
    before = r.step
    # One generation step: the next token of a running sequence.
    logits = gpt.forward(tokens)
    tokens = torch.cat([tokens, logits[-1:].argmax(-1)])
    if tokens.shape[0] > 24:
        tokens = prompt.clone()
    after = r.step
    mixed = before != after
    if before not in checked:
        # The fixed prompt on the store's weights and on the target's rank
        # file through the same code: the same bits.
        served = gpt.forward(prompt)
        ref = model()
        ref.load(load_safetensors(os.path.join(
            a.reference, f"v{before - 1}.shards", f"rank-{a.rank:05d}.safetensors")))
        want = ref.forward(prompt)
        same = torch.equal(served.view(torch.int32), want.view(torch.int32))
        # The check can fail: the previous version's logits differ.
        changed = None
        if before - 2 >= 0:
            prev = model()
            prev.load(load_safetensors(os.path.join(
                a.reference, f"v{before - 2}.shards", f"rank-{a.rank:05d}.safetensors")))
            changed = not torch.equal(prev.forward(prompt).view(torch.int32),
                                      want.view(torch.int32))
        checked.add(before)
        log.write(json.dumps({"name": a.name, "step": before, "identical": same,
                              "differs_from_previous": changed,
                              "mixed": mixed, "time": time.time(),
                              "token": int(tokens[-1])}) + "\n")
        log.flush()
    elif mixed:
        log.write(json.dumps({"name": a.name, "step": before, "mixed": True}) + "\n")
        log.flush()
    if agree(1 if before >= a.last_step else 0) == 1:
        break
    time.sleep(0.002)
