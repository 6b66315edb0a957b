"""dcr as an SGLang custom weight loader.

Written against SGLang's custom weight loader interface as on
sgl-project/sglang main at 001067ff (server_args.custom_weight_loader,
Engine.update_weights_from_tensor) and 0005834c (ModelRunner's dispatch),
after v0.5.6.post2; the loader option came with PR #7122 (2025). The
interface changes between releases: check it before use. Not tested
against SGLang itself, which these machines cannot install; see
integrations/README.md for what is tested.

SGLang calls a custom loader as `loader(model, named_tensors)` in every
tensor-parallel rank's process, between scheduler steps, with the
(name, tensor) list given to update_weights_from_tensor. dcr's weights do
not travel through that call: it carries only a request (the step to
load, the store), and each rank copies its relay's committed image into
its parameters itself.

Use:

    python -m sglang.launch_server --model-path MODEL --tp 2 \\
        --custom-weight-loader dcr_engines.sglang.load_from_dcr

    # after each `dcr refit` that committed step N:
    engine.update_weights_from_tensor(
        named_tensors=dcr_engines.sglang.request(
            N, store="shm:/dcr-serve-{rank}", socket="/run/dcr/s{rank}.sock"),
        load_format=dcr_engines.sglang.LOAD_FORMAT)

Modes as in dcr_engines.vllm: "direct" (the store is in SGLang's own
layout, copied into the parameters in place) or "load_weights" (a
canonical store, through model.load_weights).
"""

import json
import threading

import torch

from dcr_engines.source import WeightSource, load_weights

LOAD_FORMAT = "dcr_engines.sglang.load_from_dcr"
REQUEST_NAME = "dcr.request"
MODES = ("direct", "load_weights")

# One source per store for the life of the process: its thread answers the
# relay between updates.
_sources = {}
_sources_lock = threading.Lock()
# The last update of this process: {"step", "tensors", "bytes", "seconds"}.
last = None


def request(step, store, socket="", mode="direct", timeout_s=300.0,
            wait_s=60.0, ignore=()):
    """The named_tensors for update_weights_from_tensor: one uint8 tensor
    named REQUEST_NAME holding the request as JSON. `step`: the committed
    step every rank loads. "{rank}" in `store` and `socket` becomes each
    process's tensor-parallel rank. `ignore`: patterns of parameters the
    store need not feed (direct mode)."""
    if mode not in MODES:
        raise ValueError("dcr: mode '%s'; expected one of %s" %
                         (mode, ", ".join(MODES)))
    if not isinstance(step, int) or step < 0:
        raise ValueError("dcr: request needs the committed step, not %r" %
                         (step,))
    body = json.dumps({"step": step, "store": store, "socket": socket,
                       "mode": mode, "timeout_s": timeout_s,
                       "wait_s": wait_s, "ignore": list(ignore)}).encode()
    return [(REQUEST_NAME, torch.tensor(list(body), dtype=torch.uint8))]


def load_from_dcr(model, named_tensors):
    """SGLang's custom loader: loads the step the request names from this
    rank's relay into `model`."""
    global last
    req = _parse(named_tensors)
    rank = _tp_rank()
    store = req["store"].format(rank=rank)
    socket = req.get("socket", "").format(rank=rank)
    with _sources_lock:
        source = _sources.get(store)
        if source is None:
            source = WeightSource(store, socket=socket,
                                  wait=req.get("wait_s", 60.0))
            source.socket = socket
            _sources[store] = source
        elif source.socket != socket:
            raise ValueError(
                "dcr: %s is followed on socket '%s' already, not '%s' (one "
                "source per store and process; close() first)" %
                (store, source.socket, socket))
    with source.hold(req["step"], timeout=req.get("timeout_s", 300.0)) as step:
        if req.get("mode", "direct") == "direct":
            stats = source.copy_into(dict(model.named_parameters()),
                                     ignore=req.get("ignore", ()))
        else:
            stats = load_weights(source, model)
    last = dict(stats, step=step)


def close():
    """Closes this process's sources (at shutdown)."""
    with _sources_lock:
        for source in _sources.values():
            source.close()
        _sources.clear()


def _parse(named_tensors):
    found = [t for n, t in named_tensors if n == REQUEST_NAME]
    if len(found) != 1 or len(named_tensors) != 1:
        raise ValueError(
            "dcr: load_format %s takes named_tensors=dcr_engines.sglang."
            "request(...), one tensor named '%s'; got %s" %
            (LOAD_FORMAT, REQUEST_NAME, [n for n, _ in named_tensors][:5]))
    body = bytes(found[0].to("cpu", torch.uint8).tolist())
    req = json.loads(body)
    if (req.get("mode", "direct") not in MODES or "store" not in req or
            not isinstance(req.get("step"), int)):
        raise ValueError("dcr: a request without a store or a step, or with "
                         "mode '%s'" % req.get("mode"))
    return req


def _tp_rank():
    from sglang.srt.distributed import get_tensor_model_parallel_rank
    return get_tensor_model_parallel_rank()
