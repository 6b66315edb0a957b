#!/usr/bin/python3
"""A Megatron-style GPT trained by torch.distributed ranks (gloo, CPU) whose
producers diff their own shards after every Adam step (issue 17).

The model, written for the test: a vocabulary-parallel embedding and output
layer (padded vocabulary), column-parallel fused QKV with grouped-query
attention, a row-parallel output projection, column-parallel fused gate/up,
a row-parallel down projection, replicated RMS norms and an F32 master of
the final norm published as BF16 (a residual conversion). Tensor-parallel
communication is Megatron's: identity forward / all-reduce backward into
a column-parallel layer, all-reduce forward / identity backward out of a
row-parallel one, all-gather of the vocabulary-parallel logits.

After every step each rank hands its shards (torch tensors, no copy) to its
dcr.ShardProducer, which diffs them against its baseline shards and
returns chunk parts and digest parts. Rank 0 gathers a reference export of
the canonical (Hugging Face) tensors, for the check only, and checks that
the parts of all ranks take the previous export to this one bit for bit,
that the ranks' digest parts finish into each tensor's digest, and that
every part is its rank's. Then the producers advance, as on a commit.

Usage: producer_trainer_test.py PYTHON_MODULE_DIR --tp N [--steps K]
Exit 0 when every check holds; prints one JSON line of figures.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

VOCAB, PAD_TO, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS = \
    50, 4, 16, 8, 4, 2, 24, 2
SPAN = 64  # elements per span: small, so tensors have several


def layout_yaml(tp):
    return f"""version: 1
parallel: {{tp: {tp}}}
layers: {LAYERS}
tensors:
  - name: model.embed_tokens.weight
    shard: embedding.word_embeddings.weight
    split: vocab
    pad_to: {PAD_TO}
    shape: [{VOCAB}, {HIDDEN}]
  - name: model.layers.{{layer}}.input_layernorm.weight
    shard: decoder.layers.{{layer}}.input_layernorm.weight
    split: replicated
    shape: [{HIDDEN}]
  - names:
      - model.layers.{{layer}}.self_attn.q_proj.weight
      - model.layers.{{layer}}.self_attn.k_proj.weight
      - model.layers.{{layer}}.self_attn.v_proj.weight
    shard: decoder.layers.{{layer}}.self_attention.linear_qkv.weight
    split: qkv
    heads: {HEADS}
    kv_heads: {KV_HEADS}
    head_dim: {HEAD_DIM}
    columns: {HIDDEN}
  - name: model.layers.{{layer}}.self_attn.o_proj.weight
    shard: decoder.layers.{{layer}}.self_attention.linear_proj.weight
    split: row
    shape: [{HIDDEN}, {HEADS * HEAD_DIM}]
  - name: model.layers.{{layer}}.post_attention_layernorm.weight
    shard: decoder.layers.{{layer}}.pre_mlp_layernorm.weight
    split: replicated
    shape: [{HIDDEN}]
  - names:
      - model.layers.{{layer}}.mlp.gate_proj.weight
      - model.layers.{{layer}}.mlp.up_proj.weight
    shard: decoder.layers.{{layer}}.mlp.linear_fc1.weight
    split: gate_up
    shape: [{FFN}, {HIDDEN}]
  - name: model.layers.{{layer}}.mlp.down_proj.weight
    shard: decoder.layers.{{layer}}.mlp.linear_fc2.weight
    split: row
    shape: [{HIDDEN}, {FFN}]
  - name: model.norm.weight
    shard: decoder.final_layernorm.weight
    split: replicated
    shape: [{HIDDEN}]
    shard_dtype: F32
  - name: lm_head.weight
    shard: output_layer.weight
    split: vocab
    pad_to: {PAD_TO}
    shape: [{VOCAB}, {HIDDEN}]
"""


def padded_vocab(tp):
    m = PAD_TO * tp
    return (VOCAB + m - 1) // m * m


# ------------------------------------------------ tensor-parallel mappings


def all_reduce(x):
    """Sum over the ranks, in F32 (gloo's types), the same on every rank."""
    y = x.float().contiguous()
    dist.all_reduce(y)
    return y.to(x.dtype)


class CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        return all_reduce(g)


class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return all_reduce(x)

    @staticmethod
    def backward(ctx, g):
        return g


class GatherLastDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        ctx.n = x.shape[-1]
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, g):
        r = dist.get_rank()
        return g[..., r * ctx.n:(r + 1) * ctx.n].contiguous()


# ------------------------------------------------ the canonical model


def canonical_init(seed=7):
    """The canonical tensors every rank starts from (same seed on all)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return (torch.randn(*shape, generator=g) * 0.2).to(torch.bfloat16)

    c = {"model.embed_tokens.weight": rnd(VOCAB, HIDDEN),
         "lm_head.weight": rnd(VOCAB, HIDDEN),
         "model.norm.weight": torch.ones(HIDDEN)}  # F32 master
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        c[p + "input_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
        c[p + "post_attention_layernorm.weight"] = torch.ones(
            HIDDEN, dtype=torch.bfloat16)
        c[p + "self_attn.q_proj.weight"] = rnd(HEADS * HEAD_DIM, HIDDEN)
        c[p + "self_attn.k_proj.weight"] = rnd(KV_HEADS * HEAD_DIM, HIDDEN)
        c[p + "self_attn.v_proj.weight"] = rnd(KV_HEADS * HEAD_DIM, HIDDEN)
        c[p + "self_attn.o_proj.weight"] = rnd(HIDDEN, HEADS * HEAD_DIM)
        c[p + "mlp.gate_proj.weight"] = rnd(FFN, HIDDEN)
        c[p + "mlp.up_proj.weight"] = rnd(FFN, HIDDEN)
        c[p + "mlp.down_proj.weight"] = rnd(HIDDEN, FFN)
    return c


def shard_of(c, tp, t):
    """Rank t's shards, cut from canonical tensors as Megatron holds them
    (written here independently of dcr's layout maps)."""
    s = {}
    pv = padded_vocab(tp)
    rows = pv // tp
    for canon, shard in (("model.embed_tokens.weight",
                          "embedding.word_embeddings.weight"),
                         ("lm_head.weight", "output_layer.weight")):
        padded = torch.zeros(pv, HIDDEN, dtype=torch.bfloat16)
        padded[:VOCAB] = c[canon]
        s[shard] = padded[t * rows:(t + 1) * rows].clone()
    s["decoder.final_layernorm.weight"] = c["model.norm.weight"].clone()
    groups, qpg = KV_HEADS // tp, HEADS // KV_HEADS
    for i in range(LAYERS):
        p, d = f"model.layers.{i}.", f"decoder.layers.{i}."
        s[d + "input_layernorm.weight"] = c[p + "input_layernorm.weight"].clone()
        s[d + "pre_mlp_layernorm.weight"] = \
            c[p + "post_attention_layernorm.weight"].clone()
        q = c[p + "self_attn.q_proj.weight"]
        k = c[p + "self_attn.k_proj.weight"]
        v = c[p + "self_attn.v_proj.weight"]
        blocks = []
        for g in range(t * groups, (t + 1) * groups):
            blocks += [q[g * qpg * HEAD_DIM:(g + 1) * qpg * HEAD_DIM],
                       k[g * HEAD_DIM:(g + 1) * HEAD_DIM],
                       v[g * HEAD_DIM:(g + 1) * HEAD_DIM]]
        s[d + "self_attention.linear_qkv.weight"] = torch.cat(blocks).clone()
        cols = HEADS * HEAD_DIM // tp
        s[d + "self_attention.linear_proj.weight"] = \
            c[p + "self_attn.o_proj.weight"][:, t * cols:(t + 1) * cols].clone()
        f = FFN // tp
        s[d + "mlp.linear_fc1.weight"] = torch.cat(
            [c[p + "mlp.gate_proj.weight"][t * f:(t + 1) * f],
             c[p + "mlp.up_proj.weight"][t * f:(t + 1) * f]]).clone()
        s[d + "mlp.linear_fc2.weight"] = \
            c[p + "mlp.down_proj.weight"][:, t * f:(t + 1) * f].clone()
    return s


def export(params, tp):
    """The canonical tensors, gathered from every rank's shards (collective;
    the result is meaningful on rank 0): the reference the check uses."""
    full = {}
    for name, p in params.items():
        # The bits, as bytes: gloo moves them without a conversion.
        mine = p.data.contiguous().view(torch.uint8)
        parts = [torch.empty_like(mine) for _ in range(tp)]
        dist.all_gather(parts, mine)
        full[name] = [x.view(p.dtype) for x in parts]
    c = {}
    c["model.embed_tokens.weight"] = torch.cat(
        full["embedding.word_embeddings.weight"])[:VOCAB]
    c["lm_head.weight"] = torch.cat(full["output_layer.weight"])[:VOCAB]
    c["model.norm.weight"] = full["decoder.final_layernorm.weight"][0].to(
        torch.bfloat16)
    groups, qpg = KV_HEADS // tp, HEADS // KV_HEADS
    f = FFN // tp
    for i in range(LAYERS):
        p, d = f"model.layers.{i}.", f"decoder.layers.{i}."
        c[p + "input_layernorm.weight"] = full[d + "input_layernorm.weight"][0]
        c[p + "post_attention_layernorm.weight"] = \
            full[d + "pre_mlp_layernorm.weight"][0]
        qs, ks, vs = [], [], []
        for shard in full[d + "self_attention.linear_qkv.weight"]:
            per = (qpg + 2) * HEAD_DIM
            for g in range(groups):
                b = shard[g * per:(g + 1) * per]
                qs.append(b[:qpg * HEAD_DIM])
                ks.append(b[qpg * HEAD_DIM:(qpg + 1) * HEAD_DIM])
                vs.append(b[(qpg + 1) * HEAD_DIM:])
        c[p + "self_attn.q_proj.weight"] = torch.cat(qs)
        c[p + "self_attn.k_proj.weight"] = torch.cat(ks)
        c[p + "self_attn.v_proj.weight"] = torch.cat(vs)
        c[p + "self_attn.o_proj.weight"] = torch.cat(
            full[d + "self_attention.linear_proj.weight"], dim=1)
        fc1 = full[d + "mlp.linear_fc1.weight"]
        c[p + "mlp.gate_proj.weight"] = torch.cat([x[:f] for x in fc1])
        c[p + "mlp.up_proj.weight"] = torch.cat([x[f:] for x in fc1])
        c[p + "mlp.down_proj.weight"] = torch.cat(
            full[d + "mlp.linear_fc2.weight"], dim=1)
    return {k: v.contiguous() for k, v in c.items()}


def rms(x, w):
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)
    return (y * w.float()).to(torch.bfloat16)


def forward(P, tokens, tp, t):
    """Loss of the tensor-parallel model on `tokens` [B, S]."""
    rows = padded_vocab(tp) // tp
    lo = t * rows
    local = (tokens >= lo) & (tokens < lo + rows)
    ids = torch.where(local, tokens - lo, torch.zeros_like(tokens))
    x = P["embedding.word_embeddings.weight"][ids]
    x = ReduceFromTP.apply(x * local.unsqueeze(-1).to(x.dtype))
    groups, qpg = KV_HEADS // tp, HEADS // KV_HEADS
    B, S = tokens.shape
    mask = torch.full((S, S), float("-inf")).triu(1)
    for i in range(LAYERS):
        d = f"decoder.layers.{i}."
        n = CopyToTP.apply(rms(x, P[d + "input_layernorm.weight"]))
        qkv = n @ P[d + "self_attention.linear_qkv.weight"].t()
        qkv = qkv.view(B, S, groups, qpg + 2, HEAD_DIM).float()
        q, k, v = qkv[:, :, :, :qpg], qkv[:, :, :, qpg], qkv[:, :, :, qpg + 1]
        att = torch.einsum("bsgqd,btgd->bgqst", q, k) / HEAD_DIM ** 0.5
        att = torch.softmax(att + mask, dim=-1)
        o = torch.einsum("bgqst,btgd->bsgqd", att, v).reshape(B, S, -1)
        o = o.to(torch.bfloat16) @ P[d + "self_attention.linear_proj.weight"].t()
        x = x + ReduceFromTP.apply(o)
        n = CopyToTP.apply(rms(x, P[d + "pre_mlp_layernorm.weight"]))
        gu = n @ P[d + "mlp.linear_fc1.weight"].t()
        f = FFN // tp
        a = torch.nn.functional.silu(gu[..., :f].float()) * gu[..., f:].float()
        x = x + ReduceFromTP.apply(
            a.to(torch.bfloat16) @ P[d + "mlp.linear_fc2.weight"].t())
    n = CopyToTP.apply(rms(x, P["decoder.final_layernorm.weight"]))
    logits = GatherLastDim.apply(
        (n @ P["output_layer.weight"].t()).float())[..., :VOCAB]
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


# ------------------------------------------------ one rank


def check(ok, what):
    if not ok:
        raise AssertionError(what)


def bits(t):
    return t.contiguous().view(-1).view(torch.uint8)


def worker(t, tp, steps, module_dir, rdzv, result):
    sys.path.insert(0, module_dir)
    import dcr  # noqa: E402  (the module under test)
    dist.init_process_group("gloo", init_method=f"file://{rdzv}",
                            rank=t, world_size=tp)
    torch.manual_seed(100)  # the same batches on every rank
    layout_path = os.path.join(os.path.dirname(rdzv), "layout.yaml")
    layout = dcr.Layout(layout_path)
    check(layout.ranks == tp, "layout ranks")
    params = {n: torch.nn.Parameter(v)
              for n, v in shard_of(canonical_init(), tp, t).items()}
    names = set(layout.shards(t))
    check(names <= set(params), f"rank {t}: the layout names shards the "
          f"trainer lacks: {sorted(names - set(params))}")
    opt = torch.optim.Adam(params.values(), lr=2e-3)
    producer = dcr.ShardProducer(layout, t, span_elems=SPAN)
    mine = {n: params[n].data for n in names}
    producer.set_baseline(mine)
    check(producer.baseline_bytes == sum(v.numel() * v.element_size()
                                         for v in mine.values()),
          "the baseline is the rank's shards, nothing more")
    before = export(params, tp)
    figures = {"steps": [], "tp": tp}
    for step in range(1, steps + 1):
        tokens = torch.randint(0, VOCAB, (4, 12))
        loss = forward(params, tokens, tp, t)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t0 = time.perf_counter()
        out = producer.diff({n: params[n].data for n in names})
        diff_s = time.perf_counter() - t0
        for (_, _, part, _) in out["chunks"]:
            check(part == t + 1, f"rank {t} sent part {part}")
        gathered = [None] * tp
        dist.all_gather_object(gathered, out)
        after = export(params, tp)
        if t == 0:
            work = {k: v.clone() for k, v in before.items()}
            chunks = [c for o in gathered for c in o["chunks"]]
            dcr.apply_chunks(layout, work, chunks, SPAN)
            for k in after:
                check(torch.equal(bits(work[k]), bits(after[k])),
                      f"step {step}: '{k}' differs from the export after "
                      "applying every rank's parts")
            target = dcr.finish_digests(
                layout, [o["target_digests"] for o in gathered])
            base = dcr.finish_digests(
                layout, [o["base_digests"] for o in gathered])
            for k in after:
                check(target[k] == dcr.tensor_digest(after[k]),
                      f"step {step}: target digest of '{k}'")
                check(base[k] == dcr.tensor_digest(before[k]),
                      f"step {step}: base digest of '{k}'")
            elements = sum(v.numel() for v in after.values())
            figures["steps"].append({
                "step": step, "loss": float(loss),
                "changed": sum(o["changed"] for o in gathered),
                "elements": elements,
                "parts": len(chunks),
                "payload_bytes": sum(o["payload_bytes"] for o in gathered),
                "diff_seconds_rank0": diff_s})
        producer.advance({n: params[n].data for n in names})
        before = after
    # A refused advance: the trainer stepped again after the diff.
    loss = forward(params, torch.randint(0, VOCAB, (4, 12)), tp, t)
    opt.zero_grad()
    loss.backward()
    opt.step()
    producer.diff({n: params[n].data for n in names})
    opt.step()
    try:
        producer.advance({n: params[n].data for n in names})
        check(False, "an advance to other bits than the diff's was taken")
    except RuntimeError as e:
        check("did the trainer step again" in str(e), str(e))
    # Bad shards: a reshaped and a missing one.
    bad = {n: params[n].data for n in names}
    some = sorted(n for n in names if params[n].dim() == 2)[0]
    bad[some] = params[some].data[:1]
    try:
        producer.diff(bad)
        check(False, "a reshaped shard was taken")
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
    try:
        producer.diff(bad)
        check(False, "a missing shard was taken")
    except KeyError as e:
        check(some in str(e), str(e))
    if t == 0:
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
            check(tp == 0, "digest parts of no rank were finished")
        except ValueError as e:
            check("ranks" in str(e), str(e))
    dist.barrier()
    dist.destroy_process_group()
    if t == 0:
        with open(result, "w") as f:
            json.dump(figures, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("module_dir")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "layout.yaml"), "w") as f:
            f.write(layout_yaml(a.tp))
        result = os.path.join(d, "result.json")
        mp.spawn(worker, args=(a.tp, a.steps, a.module_dir,
                               os.path.join(d, "rdzv"), result),
                 nprocs=a.tp, join=True)
        figures = json.load(open(result))
    print(json.dumps(figures))
    print(f"producer_trainer: tp {a.tp}: ok", file=sys.stderr)


if __name__ == "__main__":
    main()
