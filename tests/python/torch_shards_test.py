#!/usr/bin/python3
"""dcr.write_delta on torch.save shards (issue 17: "the Python module also
reads torch.save shards").

dcr-traingen --layout writes two versions of a tiny model as every rank's
safetensors shards and as canonical files. The test re-saves each rank's
shards with torch.save (rank-RRRRR.pt, a name -> BF16 tensor dict), builds
the delta from them with dcr.write_delta, and checks that it is the very
file `dcr diff --layout` builds from the safetensors shards, and that
`dcr apply` takes the canonical v0 to a file `dcr verify` finds identical
to the canonical v1. A reshaped tensor in a .pt file is refused, naming it.

Usage: torch_shards_test.py PYTHON_MODULE_DIR DCR TRAINGEN LAYOUTS_DIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import torch


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "BF16", t
        a, b = t["data_offsets"]
        raw = bytearray(data[8 + n + a:8 + n + b])
        out[name] = torch.frombuffer(raw, dtype=torch.bfloat16).reshape(t["shape"])
    return out


def run(*cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr}")
    return r.stdout


def main():
    module, dcr_bin, traingen, layouts = sys.argv[1:5]
    sys.path.insert(0, module)
    import dcr

    t = tempfile.mkdtemp(prefix="dcr-torch-shards.")
    try:
        with open(os.path.join(layouts, "traingen-tp2-pp2.yaml")) as f:
            text = f.read()
        for a, b in (("32000", "300"), ("1024", "64"), ("2752", "192"),
                     ("layers: 8", "layers: 4"), ("heads: 16", "heads: 4"),
                     ("kv_heads: 4", "kv_heads: 2"),
                     ("head_dim: 64", "head_dim: 16")):
            text = text.replace(a, b)
        lpath = os.path.join(t, "tiny.yaml")
        with open(lpath, "w") as f:
            f.write(text)
        ck = os.path.join(t, "ck")
        run(traingen, "--hidden", "64", "--layers", "4", "--heads", "4",
            "--kv-heads", "2", "--vocab", "300", "--steps", "1", "--out", ck,
            "--layout", lpath)
        layout = dcr.Layout(lpath)
        pt = {}
        for k in (0, 1):
            d = pt[k] = os.path.join(t, f"v{k}.pt")
            os.makedirs(d)
            for r in range(layout.ranks):
                name = f"rank-{r:05d}"
                shards = read_safetensors(
                    os.path.join(ck, f"v{k}.shards", name + ".safetensors"))
                torch.save(shards, os.path.join(d, name + ".pt"))
        out = dcr.write_delta(layout, pt[0], pt[1], os.path.join(t, "pt.delta"),
                              span_elems=4096)
        assert out["chunks"] > 0 and out["changed"] > 0, out
        run(dcr_bin, "diff", "--layout", lpath, "--base-shards",
            os.path.join(ck, "v0.shards"), "--target-shards",
            os.path.join(ck, "v1.shards"), "-o", os.path.join(t, "st.delta"),
            "--span-elems", "4096")
        with open(os.path.join(t, "pt.delta"), "rb") as a, \
                open(os.path.join(t, "st.delta"), "rb") as b:
            assert a.read() == b.read(), "the .pt and safetensors deltas differ"
        work = os.path.join(t, "work.safetensors")
        shutil.copyfile(os.path.join(ck, "v0.safetensors"), work)
        run(dcr_bin, "apply", os.path.join(t, "pt.delta"), work)
        run(dcr_bin, "verify", work, os.path.join(ck, "v1.safetensors"))

        # A reshaped shard is refused, naming it.
        bad = os.path.join(t, "bad")
        shutil.copytree(pt[1], bad)
        p = os.path.join(bad, "rank-00000.pt")
        shards = torch.load(p, weights_only=True)
        name = "embedding.word_embeddings.weight"
        shards[name] = shards[name].reshape(-1)
        torch.save(shards, p)
        try:
            dcr.write_delta(layout, pt[0], bad, os.path.join(t, "bad.delta"),
                            span_elems=4096)
            sys.exit("a reshaped shard was taken")
        except ValueError as e:
            assert name in str(e) and "rank-00000.pt" in str(e), e
        print(json.dumps({"chunks": out["chunks"], "changed": out["changed"]}))
    finally:
        shutil.rmtree(t, ignore_errors=True)


if __name__ == "__main__":
    main()
