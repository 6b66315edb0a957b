"""A small GPT in the serving layout of `dcr-traingen`'s model: fused qkv
and gate/up, tensor-parallel slices joined by all-reduce, and FP8 weights
dequantized through a 256-entry lookup table (examples/serve/README.md).

The forward pass computes in float32 from the weights as the store holds
them (BF16 views, or FP8 codes and block scales), on one thread, so that
the same weights always give the same bits.
"""
import json
import struct

import torch
import torch.distributed as dist
import torch.nn.functional as F


def load_safetensors(path):
    """name -> tensor of a .safetensors file (FP8 codes as uint8)."""
    dtypes = {"BF16": torch.bfloat16, "F16": torch.float16,
              "F32": torch.float32, "F8_E4M3": torch.uint8,
              "U8": torch.uint8, "I64": torch.int64}
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack_from("<Q", data, 0)[0]
    header = json.loads(data[8:8 + n])
    body = memoryview(data)[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        t = torch.frombuffer(bytearray(body[a:b]), dtype=torch.uint8) if b > a \
            else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(dtypes[e["dtype"]]).reshape(e["shape"])
    return out


class Gpt:
    """The traingen model's forward pass for one tensor-parallel rank."""

    def __init__(self, layers, heads, kv_heads, head_dim, vocab, rank, world,
                 fp8_table=None, block=None):
        self.layers, self.rank, self.world = layers, rank, world
        self.heads, self.kv_heads = heads // world, kv_heads // world
        self.head_dim, self.vocab = head_dim, vocab
        self.lut = (torch.tensor(fp8_table, dtype=torch.float32)
                    if fp8_table is not None else None)
        self.block = block
        self.w = {}

    def load(self, tensors):
        """Points the model at `tensors` (views of the store: no copy)."""
        self.w = tensors

    def weight(self, name):
        w = self.w[name]
        if w.dtype != torch.uint8:
            return w.float()
        # FP8: codes through the table, times each block's scale.
        scale = self.w[name + "_scale_inv"]
        br, bc = self.block
        rows, cols = w.shape
        s = scale.repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]
        return self.lut[w.long()] * s

    def all_reduce(self, x):
        if self.world > 1:
            dist.all_reduce(x)
        return x

    @staticmethod
    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w.float()

    def forward(self, tokens):
        p = "model."
        emb = self.weight(p + "embed_tokens.weight")
        rows = emb.shape[0]
        local = tokens - self.rank * rows
        inside = (local >= 0) & (local < rows)
        x = emb[local.clamp(0, rows - 1)] * inside.unsqueeze(-1)
        x = self.all_reduce(x)
        t = tokens.shape[0]
        mask = torch.full((t, t), float("-inf")).triu(1)
        hq, hk, d = self.heads, self.kv_heads, self.head_dim
        for layer in range(self.layers):
            lp = f"{p}layers.{layer}."
            h = self.norm(x, self.w[lp + "input_layernorm.weight"])
            qkv = h @ self.weight(lp + "self_attn.qkv_proj.weight").t()
            q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
            q = q.view(t, hq, d).transpose(0, 1)
            k = k.view(t, hk, d).transpose(0, 1).repeat_interleave(hq // hk, 0)
            v = v.view(t, hk, d).transpose(0, 1).repeat_interleave(hq // hk, 0)
            a = torch.softmax(q @ k.transpose(1, 2) / d ** 0.5 + mask, -1) @ v
            a = a.transpose(0, 1).reshape(t, hq * d)
            x = x + self.all_reduce(a @ self.weight(lp + "self_attn.o_proj.weight").t())
            h = self.norm(x, self.w[lp + "post_attention_layernorm.weight"])
            gate, up = (h @ self.weight(lp + "mlp.gate_up_proj.weight").t()).chunk(2, -1)
            x = x + self.all_reduce(
                (F.silu(gate) * up) @ self.weight(lp + "mlp.down_proj.weight").t())
        x = self.norm(x, self.w[p + "norm.weight"])
        logits = x @ self.weight("lm_head.weight").t()
        if self.world > 1:
            parts = [torch.empty_like(logits) for _ in range(self.world)]
            dist.all_gather(parts, logits)
            logits = torch.cat(parts, -1)
        return logits[:, :self.vocab]
