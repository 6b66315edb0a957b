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
import ctypes
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

VOCAB, PAD_TO, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS = \
    50, 4, 16, 8, 4, 2, 24, 3
EXPERTS, TOP_K, EXPERT_FFN = 4, 2, 8  # the MoE MLP
SPAN = 64  # elements per span: small, so tensors have several


class Parallel:
    """The trainer's parallel sizes and its ranks, numbered as the layout
    numbers them."""

    def __init__(self, tp, pp, ep, moe):
        self.tp, self.pp, self.ep, self.moe = tp, pp, ep, moe
        self.world = tp * ep * pp
        # Layers per stage: the first stages take what an even split leaves.
        base, extra = divmod(LAYERS, pp)
        self.stages = [base + (s < extra) for s in range(pp)]

    def rank(self, t, e, s):
        return t + self.tp * (e + self.ep * s)

    def coords(self, rank):
        """(tp_rank, ep_rank, stage) of `rank`."""
        return (rank % self.tp, rank // self.tp % self.ep,
                rank // (self.tp * self.ep))

    def layers(self, s):
        """The global indices of stage s's layers, in order."""
        first = sum(self.stages[:s])
        return range(first, first + self.stages[s])

    def experts(self, e):
        """The global indices of ep rank e's experts, in order."""
        n = EXPERTS // self.ep
        return range(e * n, (e + 1) * n)


def layout_yaml(par):
    stages = ", ".join(str(n) for n in par.stages)
    head = f"""version: 1
parallel: {{tp: {par.tp}, pp: {par.pp}, ep: {par.ep}}}
layers: {LAYERS}
stages: [{stages}]
"""
    if par.moe:
        head += f"experts: {EXPERTS}\n"
    attention = f"""tensors:
  - name: model.embed_tokens.weight
    shard: embedding.word_embeddings.weight
    split: vocab
    pad_to: {PAD_TO}
    shape: [{VOCAB}, {HIDDEN}]
    stage: first
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
"""
    dense = f"""  - names:
      - model.layers.{{layer}}.mlp.gate_proj.weight
      - model.layers.{{layer}}.mlp.up_proj.weight
    shard: decoder.layers.{{layer}}.mlp.linear_fc1.weight
    split: gate_up
    shape: [{FFN}, {HIDDEN}]
  - name: model.layers.{{layer}}.mlp.down_proj.weight
    shard: decoder.layers.{{layer}}.mlp.linear_fc2.weight
    split: row
    shape: [{HIDDEN}, {FFN}]
"""
    moe = f"""  - name: model.layers.{{layer}}.mlp.gate.weight
    shard: decoder.layers.{{layer}}.mlp.router.weight
    split: replicated
    shape: [{EXPERTS}, {HIDDEN}]
  - names:
      - model.layers.{{layer}}.mlp.experts.{{expert}}.gate_proj.weight
      - model.layers.{{layer}}.mlp.experts.{{expert}}.up_proj.weight
    shard: decoder.layers.{{layer}}.mlp.experts.local_experts.{{expert}}.linear_fc1.weight
    split: gate_up
    shape: [{EXPERT_FFN}, {HIDDEN}]
  - name: model.layers.{{layer}}.mlp.experts.{{expert}}.down_proj.weight
    shard: decoder.layers.{{layer}}.mlp.experts.local_experts.{{expert}}.linear_fc2.weight
    split: row
    shape: [{HIDDEN}, {EXPERT_FFN}]
"""
    output = f"""  - name: model.norm.weight
    shard: decoder.final_layernorm.weight
    split: replicated
    shape: [{HIDDEN}]
    shard_dtype: F32
    stage: last
  - name: lm_head.weight
    shard: output_layer.weight
    split: vocab
    pad_to: {PAD_TO}
    shape: [{VOCAB}, {HIDDEN}]
    stage: last
"""
    return head + attention + (moe if par.moe else dense) + output


def padded_vocab(tp):
    m = PAD_TO * tp
    return (VOCAB + m - 1) // m * m


# ------------------------------------------------ parallel mappings


def all_reduce(x, group):
    """Sum over the group, in F32 (gloo's types), the same on every rank."""
    y = x.float().contiguous()
    dist.all_reduce(y, group=group)
    return y.to(x.dtype)


class CopyTo(torch.autograd.Function):
    """Into a region parallel over `group`: identity, all-reduce backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        return all_reduce(g, ctx.group), None


class ReduceFrom(torch.autograd.Function):
    """Out of a region parallel over `group`: all-reduce, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x, group)

    @staticmethod
    def backward(ctx, g):
        return g, None


class GatherLastDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        parts = [torch.empty_like(x)
                 for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        ctx.n, ctx.r = x.shape[-1], dist.get_rank(group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, g):
        return g[..., ctx.r * ctx.n:(ctx.r + 1) * ctx.n].contiguous(), None


class Groups:
    """A rank's process groups: `tp`, the ranks of its stage and ep rank
    (tensor parallel); `stage`, all its stage's ranks (the MoE MLP sums its
    experts' outputs over them)."""

    def __init__(self, par, rank):
        _, e, s = par.coords(rank)
        # Every rank creates every group, in the same order.
        for gs in range(par.pp):
            for ge in range(par.ep):
                first = par.rank(0, ge, gs)
                g = dist.new_group(list(range(first, first + par.tp)))
                if (ge, gs) == (e, s):
                    self.tp = g
            first = par.rank(0, 0, gs)
            g = dist.new_group(list(range(first, first + par.tp * par.ep)))
            if gs == s:
                self.stage = g


# ------------------------------------------------ the canonical model


def canonical_init(moe, seed=7):
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
        if not moe:
            c[p + "mlp.gate_proj.weight"] = rnd(FFN, HIDDEN)
            c[p + "mlp.up_proj.weight"] = rnd(FFN, HIDDEN)
            c[p + "mlp.down_proj.weight"] = rnd(HIDDEN, FFN)
            continue
        c[p + "mlp.gate.weight"] = rnd(EXPERTS, HIDDEN)
        for x in range(EXPERTS):
            q = p + f"mlp.experts.{x}."
            c[q + "gate_proj.weight"] = rnd(EXPERT_FFN, HIDDEN)
            c[q + "up_proj.weight"] = rnd(EXPERT_FFN, HIDDEN)
            c[q + "down_proj.weight"] = rnd(HIDDEN, EXPERT_FFN)
    return c


# How Megatron cuts a tensor for tensor-parallel rank t of tp, and how the
# cuts of all tp ranks join again (written here independently of dcr's
# layout maps).


def vocab_cut(w, t, tp):
    padded = torch.zeros(padded_vocab(tp), w.shape[1], dtype=w.dtype)
    padded[:VOCAB] = w
    rows = padded.shape[0] // tp
    return padded[t * rows:(t + 1) * rows].clone()


def vocab_join(cuts):
    return torch.cat(cuts)[:VOCAB]


def qkv_cut(q, k, v, t, tp):
    groups, qpg = KV_HEADS // tp, HEADS // KV_HEADS
    blocks = []
    for g in range(t * groups, (t + 1) * groups):
        blocks += [q[g * qpg * HEAD_DIM:(g + 1) * qpg * HEAD_DIM],
                   k[g * HEAD_DIM:(g + 1) * HEAD_DIM],
                   v[g * HEAD_DIM:(g + 1) * HEAD_DIM]]
    return torch.cat(blocks).clone()


def qkv_join(cuts):
    groups, qpg = KV_HEADS // len(cuts), HEADS // KV_HEADS
    per = (qpg + 2) * HEAD_DIM
    qs, ks, vs = [], [], []
    for cut in cuts:
        for g in range(groups):
            b = cut[g * per:(g + 1) * per]
            qs.append(b[:qpg * HEAD_DIM])
            ks.append(b[qpg * HEAD_DIM:(qpg + 1) * HEAD_DIM])
            vs.append(b[(qpg + 1) * HEAD_DIM:])
    return torch.cat(qs), torch.cat(ks), torch.cat(vs)


def gate_up_cut(gate, up, t, tp):
    f = gate.shape[0] // tp
    return torch.cat([gate[t * f:(t + 1) * f], up[t * f:(t + 1) * f]]).clone()


def gate_up_join(cuts):
    f = cuts[0].shape[0] // 2
    return torch.cat([x[:f] for x in cuts]), torch.cat([x[f:] for x in cuts])


def row_cut(w, t, tp):
    cols = w.shape[1] // tp
    return w[:, t * cols:(t + 1) * cols].clone()


def row_join(cuts):
    return torch.cat(cuts, dim=1)


def mlp_names(par, p, d, e):
    """(canonical gate, up, down; shard fc1, fc2) of the MLPs of layer
    prefix p (canonical) / d (the rank's shard) on ep rank e: the dense
    one, or e's experts."""
    if not par.moe:
        return [(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
                 p + "mlp.down_proj.weight",
                 d + "mlp.linear_fc1.weight", d + "mlp.linear_fc2.weight")]
    out = []
    for k, x in enumerate(par.experts(e)):
        q = p + f"mlp.experts.{x}."
        m = d + f"mlp.experts.local_experts.{k}."
        out.append((q + "gate_proj.weight", q + "up_proj.weight",
                    q + "down_proj.weight",
                    m + "linear_fc1.weight", m + "linear_fc2.weight"))
    return out


def shard_of(c, par, rank):
    """A rank's shards, cut from canonical tensors as Megatron holds them:
    its stage's layers under local names and, with experts, its ep rank's
    experts under local names."""
    t, e, s = par.coords(rank)
    tp = par.tp
    sh = {}
    if s == 0:
        sh["embedding.word_embeddings.weight"] = vocab_cut(
            c["model.embed_tokens.weight"], t, tp)
    if s == par.pp - 1:
        sh["decoder.final_layernorm.weight"] = c["model.norm.weight"].clone()
        sh["output_layer.weight"] = vocab_cut(c["lm_head.weight"], t, tp)
    for j, i in enumerate(par.layers(s)):
        p, d = f"model.layers.{i}.", f"decoder.layers.{j}."
        sh[d + "input_layernorm.weight"] = c[p + "input_layernorm.weight"].clone()
        sh[d + "pre_mlp_layernorm.weight"] = \
            c[p + "post_attention_layernorm.weight"].clone()
        sh[d + "self_attention.linear_qkv.weight"] = qkv_cut(
            c[p + "self_attn.q_proj.weight"], c[p + "self_attn.k_proj.weight"],
            c[p + "self_attn.v_proj.weight"], t, tp)
        sh[d + "self_attention.linear_proj.weight"] = row_cut(
            c[p + "self_attn.o_proj.weight"], t, tp)
        if par.moe:
            sh[d + "mlp.router.weight"] = c[p + "mlp.gate.weight"].clone()
        for gate, up, down, fc1, fc2 in mlp_names(par, p, d, e):
            sh[fc1] = gate_up_cut(c[gate], c[up], t, tp)
            sh[fc2] = row_cut(c[down], t, tp)
    return sh


def canonical_of(held, par):
    """The canonical tensors from every rank's shards (held[rank]). A tensor
    held whole by several ranks is read from its owner, the stage's rank of
    tp and ep rank 0; one split over tp from the ranks of ep rank 0, an
    expert's from its ep rank's."""
    def tp_ranks(s, e=0):
        return [held[par.rank(t, e, s)] for t in range(par.tp)]

    first, last = tp_ranks(0), tp_ranks(par.pp - 1)
    c = {"model.embed_tokens.weight": vocab_join(
             [h["embedding.word_embeddings.weight"] for h in first]),
         "lm_head.weight": vocab_join(
             [h["output_layer.weight"] for h in last]),
         "model.norm.weight": last[0]["decoder.final_layernorm.weight"].to(
             torch.bfloat16)}
    for s in range(par.pp):
        ranks = tp_ranks(s)
        for j, i in enumerate(par.layers(s)):
            p, d = f"model.layers.{i}.", f"decoder.layers.{j}."
            c[p + "input_layernorm.weight"] = \
                ranks[0][d + "input_layernorm.weight"]
            c[p + "post_attention_layernorm.weight"] = \
                ranks[0][d + "pre_mlp_layernorm.weight"]
            qkv = [h[d + "self_attention.linear_qkv.weight"] for h in ranks]
            for x, w in zip("qkv", qkv_join(qkv)):
                c[p + f"self_attn.{x}_proj.weight"] = w
            c[p + "self_attn.o_proj.weight"] = row_join(
                [h[d + "self_attention.linear_proj.weight"] for h in ranks])
            if par.moe:
                c[p + "mlp.gate.weight"] = ranks[0][d + "mlp.router.weight"]
            for e in range(par.ep):
                cuts = tp_ranks(s, e)
                for gate, up, down, fc1, fc2 in mlp_names(par, p, d, e):
                    c[gate], c[up] = gate_up_join([h[fc1] for h in cuts])
                    c[down] = row_join([h[fc2] for h in cuts])
    return {k: v.contiguous() for k, v in c.items()}


def export(params, par):
    """The canonical tensors, gathered on rank 0 from every rank's shards
    (collective; None on the other ranks): the reference the check uses."""
    held = [None] * par.world if dist.get_rank() == 0 else None
    # Pickled tensors: their bits cross unchanged.
    dist.gather_object({n: p.detach() for n, p in params.items()}, held,
                       dst=0)
    return None if held is None else canonical_of(held, par)


# ------------------------------------------------ the forward pass


def rms(x, w):
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)
    return (y * w.float()).to(torch.bfloat16)


def embed(P, tokens, par, t, G):
    rows = padded_vocab(par.tp) // par.tp
    lo = t * rows
    local = (tokens >= lo) & (tokens < lo + rows)
    ids = torch.where(local, tokens - lo, torch.zeros_like(tokens))
    x = P["embedding.word_embeddings.weight"][ids]
    return ReduceFrom.apply(x * local.unsqueeze(-1).to(x.dtype), G.tp)


def dense_mlp(P, n, d, par, G):
    n = CopyTo.apply(n, G.tp)
    gu = n @ P[d + "mlp.linear_fc1.weight"].t()
    f = FFN // par.tp
    a = torch.nn.functional.silu(gu[..., :f].float()) * gu[..., f:].float()
    return ReduceFrom.apply(
        a.to(torch.bfloat16) @ P[d + "mlp.linear_fc2.weight"].t(), G.tp)


def moe_mlp(P, n, d, par, e, G):
    """Each token's top-2 experts by the replicated router, weighted by the
    router's softmax renormalized over them; this rank computes its own
    experts (their tp slices) on the tokens routed to them, and the stage's
    ranks sum the outputs."""
    B, S, H = n.shape
    n = n.reshape(-1, H)
    probs = torch.softmax((n @ P[d + "mlp.router.weight"].t()).float(), -1)
    weight, chosen = probs.topk(TOP_K, dim=-1)
    weight = weight / weight.sum(-1, keepdim=True)
    # The router's path is replicated, the experts' parallel over the stage.
    xn, weight = CopyTo.apply(n, G.stage), CopyTo.apply(weight, G.stage)
    f = EXPERT_FFN // par.tp
    y = torch.zeros(n.shape)
    for k, x in enumerate(par.experts(e)):
        tok, slot = (chosen == x).nonzero(as_tuple=True)
        m = d + f"mlp.experts.local_experts.{k}."
        gu = xn[tok] @ P[m + "linear_fc1.weight"].t()
        a = torch.nn.functional.silu(gu[:, :f].float()) * gu[:, f:].float()
        out = (a.to(torch.bfloat16) @ P[m + "linear_fc2.weight"].t()).float()
        y = y.index_add(0, tok, out * weight[tok, slot].unsqueeze(-1))
    return ReduceFrom.apply(y, G.stage).to(torch.bfloat16).view(B, S, H)


def layer(P, x, d, par, e, G):
    """One decoder layer; d: its shards' prefix on this rank."""
    groups, qpg = KV_HEADS // par.tp, HEADS // KV_HEADS
    B, S, _ = x.shape
    mask = torch.full((S, S), float("-inf")).triu(1)
    n = CopyTo.apply(rms(x, P[d + "input_layernorm.weight"]), G.tp)
    qkv = n @ P[d + "self_attention.linear_qkv.weight"].t()
    qkv = qkv.view(B, S, groups, qpg + 2, HEAD_DIM).float()
    q, k, v = qkv[:, :, :, :qpg], qkv[:, :, :, qpg], qkv[:, :, :, qpg + 1]
    att = torch.einsum("bsgqd,btgd->bgqst", q, k) / HEAD_DIM ** 0.5
    att = torch.softmax(att + mask, dim=-1)
    o = torch.einsum("bgqst,btgd->bsgqd", att, v).reshape(B, S, -1)
    o = o.to(torch.bfloat16) @ P[d + "self_attention.linear_proj.weight"].t()
    x = x + ReduceFrom.apply(o, G.tp)
    n = rms(x, P[d + "pre_mlp_layernorm.weight"])
    if par.moe:
        return x + moe_mlp(P, n, d, par, e, G)
    return x + dense_mlp(P, n, d, par, G)


def output_loss(P, x, tokens, G):
    n = CopyTo.apply(rms(x, P["decoder.final_layernorm.weight"]), G.tp)
    logits = GatherLastDim.apply(
        (n @ P["output_layer.weight"].t()).float(), G.tp)[..., :VOCAB]
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def train_step(P, opt, tokens, par, rank, G):
    """One Adam step on `tokens` [B, S]. A stage runs its layers on what the
    stage before sent (from its rank of the same tp and ep rank), the last
    stage computes the loss, and the gradients go back the same way. The
    loss on the last stage, None elsewhere."""
    t, e, s = par.coords(rank)
    if s == 0:
        x = embed(P, tokens, par, t, G)
    else:
        x_in = torch.empty(*tokens.shape, HIDDEN, dtype=torch.bfloat16)
        dist.recv(x_in, par.rank(t, e, s - 1))
        x = x_in.requires_grad_()
    for j in range(par.stages[s]):
        x = layer(P, x, f"decoder.layers.{j}.", par, e, G)
    opt.zero_grad()
    loss = None
    if s == par.pp - 1:
        loss = output_loss(P, x, tokens, G)
        loss.backward()
    else:
        dist.send(x.detach(), par.rank(t, e, s + 1))
        g = torch.empty_like(x)
        dist.recv(g, par.rank(t, e, s + 1))
        x.backward(g)
    if s > 0:
        dist.send(x_in.grad, par.rank(t, e, s - 1))
    opt.step()
    return None if loss is None else float(loss)


# ------------------------------------------------ the relay tree (--refit)

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


# ------------------------------------------------ one rank


def check(ok, what):
    if not ok:
        raise AssertionError(what)


def bits(t):
    return t.contiguous().view(-1).view(torch.uint8)


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
    # A refused advance: the trainer stepped again after the diff.
    train_step(params, opt, torch.randint(0, VOCAB, (4, 12)), par, rank, G)
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
