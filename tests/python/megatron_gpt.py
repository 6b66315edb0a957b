"""The Megatron-style GPT that producer_trainer_test.py trains over
torch.distributed ranks (gloo, CPU): its parallel sizes and rank numbering,
the layout YAML that maps its shards to canonical tensors, the canonical
initial weights and their cuts into shards (and joins back, for the
reference export), and the forward, backward and Adam step of one rank.
See producer_trainer_test.py's docstring for the model and the schemes.
"""
import torch
import torch.distributed as dist

VOCAB, PAD_TO, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS = \
    50, 4, 16, 8, 4, 2, 24, 3
EXPERTS, TOP_K, EXPERT_FFN = 4, 2, 8  # the MoE MLP


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
