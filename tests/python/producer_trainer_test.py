#!/usr/bin/python3
"""A Megatron-style GPT trained by torch.distributed ranks (gloo, CPU) whose
producers diff their own shards after every Adam step (issue 17).

The model, written for the test: a vocabulary-parallel embedding and output
layer (padded vocabulary), column-parallel fused QKV with grouped-query
attention, a row-parallel output projection, an MLP, replicated RMS norms
and an F32 master of the final norm published as BF16 (a residual
conversion). The MLP is dense (column-parallel fused gate/up, row-parallel
down projection) or, with --moe, a mixture of experts: a replicated router
sends each token to its top 2 of 4 experts, each expert a fused gate/up and
a down projection of its own, split over tensor parallel like the dense one.

Ranks are numbered as the layout numbers them (docs/PLACEMENT.md), tensor
parallel fastest: rank = tp_rank + tp * (ep_rank + ep * stage).
- Tensor parallel (--tp): Megatron's communication, identity forward /
  all-reduce backward into a column-parallel layer, all-reduce forward /
  identity backward out of a row-parallel one, all-gather of the
  vocabulary-parallel logits.
- Pipeline parallel (--pp): a stage holds its layers under local names
  (stage 0 also the embedding, the last the final norm and output layer);
  activations go to the next stage's rank of the same tp and ep rank and
  gradients come back (send/recv); the loss is the last stage's. 3 layers:
  the stages split them unevenly ([2, 1] for pp 2).
- Expert parallel (--ep, implies --moe): each ep rank of a stage holds
  4/ep experts under local names. Every rank routes the same tokens and
  computes its experts (their tp slices) on the tokens routed to them; the
  stage's ranks sum the outputs. The rest of the stage is replicated over
  the ep ranks and produced by ep rank 0.

After every step each rank hands its shards (torch tensors, no copy) to its
dcr.ShardProducer, which diffs them against its baseline shards and
returns chunk parts and digest parts. Rank 0 gathers a reference export of
the canonical (Hugging Face) tensors, for the check only, and checks that
the parts of all ranks take the previous export to this one bit for bit,
that the ranks' digest parts finish into each tensor's digest, and that
every part is its rank's. Then the producers advance, as on a commit.

With --refit DCR DCR_RELAY, every rank's dcr.Producer also refits a local
relay tree after each step: two dcr-relay processes on loopback fed by a
`dcr refit --producers N` coordinator. Before training rank 0 writes the
reference export of the initial weights as a canonical safetensors file,
which becomes root.baseline and both relays' stores; the test process
starts the relays and the coordinator, and after every step all ranks call
refit(step, shards) at once. Every rank must be told "committed" for this
step, with the version digest the ranks' digest parts finish into, and
after each commit rank 0 checks with `dcr verify` that both relays' stores
and root.baseline hold the step's reference export bit for bit. At the end
the coordinator must have exited 0, reporting every step committed on every
node, and the relays must exit 0 on SIGTERM.

Usage: producer_trainer_test.py PYTHON_MODULE_DIR [--tp N] [--pp N] [--ep N]
           [--moe] [--steps K] [--refit DCR DCR_RELAY]
Exit 0 when every check holds; prints one JSON line of figures.
"""
import argparse
import json
import os
import signal
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from megatron_gpt import (EXPERTS, KV_HEADS, LAYERS, TOP_K, VOCAB, Groups,
                          Parallel, canonical_init, export, layout_yaml,
                          shard_of, train_step)
from relay_tree import (SPAN, RelayTree, bits, check, dcr_verify,
                        die_with_parent, write_safetensors)


# ------------------------------------------------ one rank


def wait_file(path, within, what):
    end = time.monotonic() + within
    while not os.path.exists(path):
        check(time.monotonic() < end, f"{what}: not within {within:g} s")
        time.sleep(0.02)


def worker(rank, par, steps, module_dir, rdzv, result, tree):
    """One trainer rank. tree (--refit): the relay tree the test process
    starts, {"coordinator": host:port, "dir": the test's directory, "dcr":
    the binary, "stores": the files dcr verify checks}; else None."""
    # A rank does not outlive the test process (killed by its timeout).
    parent = os.getppid()
    die_with_parent()
    if os.getppid() != parent:
        os._exit(1)
    sys.path.insert(0, module_dir)
    import dcr  # noqa: E402  (the module under test)
    dist.init_process_group("gloo", init_method=f"file://{rdzv}",
                            rank=rank, world_size=par.world)
    G = Groups(par, rank)
    torch.manual_seed(100)  # the same batches on every rank
    layout_path = os.path.join(os.path.dirname(rdzv), "layout.yaml")
    layout = dcr.Layout(layout_path)
    check(layout.ranks == par.world, "layout ranks")
    params = {n: torch.nn.Parameter(v)
              for n, v in shard_of(canonical_init(par.moe), par, rank).items()}
    names = set(layout.shards(rank))
    check(names <= set(params), f"rank {rank}: the layout names shards the "
          f"trainer lacks: {sorted(names - set(params))}")
    opt = torch.optim.Adam(params.values(), lr=2e-3)
    producer = dcr.ShardProducer(layout, rank, span_elems=SPAN)
    mine = {n: params[n].data for n in names}
    producer.set_baseline(mine)
    check(producer.baseline_bytes == sum(v.numel() * v.element_size()
                                         for v in mine.values()),
          "the baseline is the rank's shards, nothing more")
    live = None
    if tree:
        live = dcr.Producer(layout, rank, tree["coordinator"], timeout_s=60)
        check(live.rank == rank, "the producer's rank")
        live.set_baseline(mine)
    before = first = export(params, par)
    if rank == 0:
        check(sorted(before) == layout.tensors,
              "the layout's tensors are the model's")
    if tree:
        ref = os.path.join(tree["dir"], "ref")
        if rank == 0:
            # The tree's version 0: the test process copies it to
            # root.baseline and both relays' stores and starts them.
            write_safetensors(os.path.join(ref, "v0.safetensors"), before)
            wait_file(os.path.join(tree["dir"], "tree.ready"), 60,
                      "the relay tree")
        dist.barrier()
    figures = {"steps": [], "tp": par.tp, "pp": par.pp, "ep": par.ep,
               "experts": EXPERTS if par.moe else 0}
    for step in range(1, steps + 1):
        tokens = torch.randint(0, VOCAB, (4, 12))
        loss = train_step(params, opt, tokens, par, rank, G)
        t0 = time.perf_counter()
        out = producer.diff({n: params[n].data for n in names})
        diff_s = time.perf_counter() - t0
        for (_, _, part, _) in out["chunks"]:
            check(part == rank + 1, f"rank {rank} sent part {part}")
        decision = None
        if live:
            # Every rank at once (each its own process): the coordinator
            # merges their streams into one refit of the tree.
            decision = live.refit(step, {n: params[n].data for n in names})
        gathered = [None] * par.world if rank == 0 else None
        dist.gather_object((out, loss, decision), gathered, dst=0)
        after = export(params, par)
        if rank == 0:
            outs = [o for o, _, _ in gathered]
            work = {k: v.clone() for k, v in before.items()}
            chunks = [c for o in outs for c in o["chunks"]]
            dcr.apply_chunks(layout, work, chunks, SPAN)
            for k in after:
                check(torch.equal(bits(work[k]), bits(after[k])),
                      f"step {step}: '{k}' differs from the export after "
                      "applying every rank's parts")
            target = dcr.finish_digests(
                layout, [o["target_digests"] for o in outs])
            base = dcr.finish_digests(
                layout, [o["base_digests"] for o in outs])
            for k in after:
                check(target[k] == dcr.tensor_digest(after[k]),
                      f"step {step}: target digest of '{k}'")
                check(base[k] == dcr.tensor_digest(before[k]),
                      f"step {step}: base digest of '{k}'")
            if live:
                decisions = [d for _, _, d in gathered]
                for r, (d, o) in enumerate(zip(decisions, outs)):
                    check(d["outcome"] == "committed" and d["committed"] and
                          d["target_step"] == step and not d["reason"],
                          f"step {step}: rank {r}'s decision {d}")
                    # The same spans as the ShardProducer's (the topology's
                    # span_elems is SPAN): the same parts.
                    check(d["chunks"] == len(o["chunks"]) and
                          d["changed"] == o["changed"],
                          f"step {step}: rank {r} streamed {d['chunks']} "
                          f"chunks, {d['changed']} changed; its diff has "
                          f"{len(o['chunks'])}, {o['changed']}")
                check(len({d["refit"] for d in decisions}) == 1,
                      f"step {step}: the ranks were told of several refits")
                check(all(d["target_digest"] == target["__version__"]
                          for d in decisions),
                      f"step {step}: the tree's version is not the one the "
                      "ranks' digest parts finish into")
                # The reference export, for the check only.
                t0 = time.perf_counter()
                path = os.path.join(ref, f"v{step}.safetensors")
                write_safetensors(path, after)
                for store in tree["stores"]:
                    dcr_verify(tree["dcr"], store, path)
                verify_s = time.perf_counter() - t0
            elements = sum(v.numel() for v in after.values())
            figures["steps"].append({
                "step": step,
                "loss": gathered[par.rank(0, 0, par.pp - 1)][1],
                "changed": sum(o["changed"] for o in outs),
                "elements": elements,
                "parts": len(chunks),
                "payload_bytes": sum(o["payload_bytes"] for o in outs),
                "diff_seconds_rank0": diff_s})
            if live:
                figures["steps"][-1].update({
                    "refit": decisions[0]["refit"],
                    "refit_seconds": max(d["total_seconds"]
                                         for d in decisions),
                    "verify_seconds": verify_s})
        producer.advance({n: params[n].data for n in names})
        before = after
    if rank == 0 and par.moe:
        # Routed: every expert got tokens, so its weights moved.
        for k in first:
            if ".mlp.experts." in k:
                check(not torch.equal(bits(first[k]), bits(before[k])),
                      f"'{k}' never changed: no token was routed to it")
    # The trainer stepped again after the diff. With the step's change log
    # the advance takes the bits the diff read (the tree's), not these;
    # without one it is refused.
    # (This small model's Adam steps change most elements: past the
    # default bound of a quarter of the shards' bytes, so the bound here
    # is larger.)
    pre = {n: params[n].data.clone() for n in names}
    train_step(params, opt, torch.randint(0, VOCAB, (4, 12)), par, rank, G)
    diffed = {n: params[n].data.clone() for n in names}
    loose = dcr.ShardProducer(layout, rank, span_elems=SPAN,
                              step_log_bytes=1 << 30)
    loose.set_baseline(pre)
    logged = loose.diff({n: params[n].data for n in names})
    check(logged["logged"] and logged["log_bytes"] > 0,
          f"a step within its log's bound kept no log: {logged['log_bytes']}")
    opt.step()
    loose.advance({n: params[n].data for n in names})
    check(loose.diff(diffed)["changed"] == 0,
          "the advance did not take the diffed bits")
    loose.rewind()
    # Not committed: rewind puts the base back, and the same diff gives the
    # same parts.
    again = loose.diff({n: params[n].data for n in names})
    loose.rewind()
    check(loose.diff({n: params[n].data for n in names})["chunks"] ==
          again["chunks"], "a rewound diff gave other parts")
    loose.rewind()
    strict = dcr.ShardProducer(layout, rank, span_elems=SPAN, step_log_bytes=0)
    strict.set_baseline(pre)
    strict.diff(diffed)
    try:
        strict.advance({n: params[n].data for n in names})
        check(False, "an advance to other bits than the diff's was taken")
    except RuntimeError as e:
        check("did the trainer step again" in str(e), str(e))
    # Bad shards: a reshaped and a missing one.
    bad = {n: params[n].data for n in names}
    some = sorted(n for n in names if params[n].dim() == 2)[0]
    bad[some] = params[some].data[:1]
    for p in (producer, live) if live else (producer,):
        try:
            p.refit(steps + 1, bad) if p is live else p.diff(bad)
            check(False, f"a reshaped shard was taken by {type(p).__name__}")
        except ValueError as e:
            check("changes a tensor's shape" in str(e), str(e))
    # A tensor of the right size but transposed: refused, not read as is.
    bad[some] = params[some].data.t().contiguous()
    if bad[some].shape != params[some].shape:
        try:
            producer.diff(bad)
            check(False, "a transposed shard was taken")
        except ValueError as e:
            check("but layout" in str(e), str(e))
    del bad[some]
    for p in (producer, live) if live else (producer,):
        try:
            p.refit(steps + 1, bad) if p is live else p.diff(bad)
            check(False, f"a missing shard was taken by {type(p).__name__}")
        except KeyError as e:
            check(some in str(e), str(e))
    if rank == 0:
        import numpy as np
        try:
            dcr.tensor_digest(np.arange(10, dtype=np.int16)[::2])
            check(False, "a strided buffer was read as contiguous")
        except ValueError as e:
            check("not a contiguous" in str(e), str(e))
        try:
            dcr.Layout(layout_path + ".missing")
            check(False, "a missing layout file was taken")
        except FileNotFoundError:
            pass
        try:
            dcr.finish_digests(layout, [])
            check(False, "digest parts of no rank were finished")
        except ValueError as e:
            check("ranks" in str(e), str(e))
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        with open(result, "w") as f:
            json.dump(figures, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("module_dir")
    ap.add_argument("--tp", type=int, default=2, help="tensor parallel")
    ap.add_argument("--pp", type=int, default=1, help="pipeline stages")
    ap.add_argument("--ep", type=int, default=1,
                    help="expert parallel (implies --moe)")
    ap.add_argument("--moe", action="store_true",
                    help=f"an MoE MLP of {EXPERTS} experts, top {TOP_K}")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--refit", nargs=2, metavar=("DCR", "DCR_RELAY"),
                    help="after each step every rank's dcr.Producer refits "
                    "a relay tree of two dcr-relay processes (these "
                    "binaries) on loopback")
    a = ap.parse_args()
    if KV_HEADS % a.tp:
        ap.error(f"--tp must divide the {KV_HEADS} kv heads")
    if not 1 <= a.pp <= LAYERS:
        ap.error(f"--pp must be 1 to {LAYERS} (the layers)")
    if EXPERTS % a.ep:
        ap.error(f"--ep must divide {EXPERTS} experts")
    par = Parallel(a.tp, a.pp, a.ep, a.moe or a.ep > 1)
    torch.set_num_threads(1)
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "layout.yaml"), "w") as f:
            f.write(layout_yaml(par))
        result = os.path.join(d, "result.json")
        tree = spec = None
        if a.refit:
            tree = RelayTree(d, *a.refit, par, a.steps)
            spec = {"coordinator": tree.coordinator, "dir": d,
                    "dcr": a.refit[0], "stores": tree.stores()}
        # Forked, not spawned: a spawned rank imports torch again (about a
        # second of CPU each).
        ranks = mp.start_processes(
            worker, args=(par, a.steps, a.module_dir,
                          os.path.join(d, "rdzv"), result, spec),
            nprocs=par.world, join=False, start_method="fork")
        # The ranks are forked: from here a SIGTERM ends this process
        # through the cleanup below (SIGKILL: the children's death signal).
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            if tree:
                v0 = tree.reference(0)
                while not os.path.exists(v0):
                    check(not ranks.join(timeout=0.05),
                          "the ranks ended before rank 0 wrote version 0")
                tree.start()
                open(os.path.join(d, "tree.ready"), "w").close()
            while not ranks.join():
                pass
            if tree:
                reports = tree.finish()
        finally:
            for p in ranks.processes:
                if p.is_alive():
                    p.terminate()
                    p.join()
            if tree:
                tree.kill()
        figures = json.load(open(result))
    if tree:
        figures["coordinator"] = [
            {k: r.get(k) for k in ("trainer_step", "outcome", "chunks",
                                   "changed_elements", "seconds")}
            for r in reports]
    figures["seconds"] = round(time.monotonic() - t_start, 2)
    print(json.dumps(figures))
    print(f"producer_trainer: tp {par.tp} pp {par.pp} ep {par.ep}"
          f"{' moe' if par.moe else ''}"
          f"{' refit of a relay tree' if tree else ''}: ok", file=sys.stderr)


if __name__ == "__main__":
    main()
