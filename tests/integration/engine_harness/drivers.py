"""CALL-ORDER HARNESS, NOT vLLM OR SGLANG (README.md beside this file).

The engines' side of the calls into dcr_engines, as their workers make them:
- VllmWorker: vLLM v0.25.0's gpu_worker methods init_weight_transfer_engine,
  start_weight_update, update_weights, finish_weight_update, shutdown,
  around an engine that WeightTransferEngineFactory.create_engine builds;
- SglangEngine: SGLang's Engine.update_weights_from_tensor(named_tensors,
  load_format=None, flush_cache=True) sending the list to every
  tensor-parallel rank, whose ModelRunner dispatches on load_format
  (direct, a loader listed in --custom-weight-loader, or None).
Every tensor-parallel rank runs in this one process; the harness sets the
rank the fake get_tensor_model_parallel_rank() returns before each call.
"""

import importlib
import pickle
from types import SimpleNamespace


class StandInModel:
    """What the adapters use of an engine's model: named_parameters() and
    load_weights((name, tensor) pairs). load_weights copies by name: a
    stand-in for an engine's loader, which would fuse and slice."""

    def __init__(self, tensors):
        self.params = {n: t.clone() for n, t in tensors.items()}
        self.loaded = 0

    def named_parameters(self):
        return iter(self.params.items())

    def load_weights(self, weights):
        for name, t in weights:
            self.params[name].copy_(t)
            self.loaded += 1


class VllmWorker:
    def __init__(self, backend, rank, model):
        from vllm.distributed.weight_transfer.factory import \
            WeightTransferEngineFactory
        self.rank = rank
        self.model = model
        self._active = False
        self.calls = []
        self._as_rank()
        self.engine = WeightTransferEngineFactory.create_engine(
            SimpleNamespace(backend=backend),
            SimpleNamespace(parallel_config=None, model_config=None),
            "cpu", model)

    def _as_rank(self):
        from vllm.distributed import set_rank_for_harness
        set_rank_for_harness(self.rank)

    def init_weight_transfer_engine(self, init_info):
        self.calls.append("init_weight_transfer_engine")
        self._as_rank()
        self.engine.init_transfer_engine(self.engine.parse_init_info(init_info))

    def start_weight_update(self):
        self.calls.append("start_weight_update")
        if self._active:
            raise RuntimeError("a weight update is already active")
        self._as_rank()
        self.engine.start_weight_update()
        self._active = True

    def update_weights(self, update_info):
        self.calls.append("update_weights")
        if not self._active:
            raise RuntimeError("start_weight_update first")
        self._as_rank()
        try:
            self.engine.update_weights(update_info)
        except Exception:
            self._active = False  # as vLLM's worker: the update is over
            raise

    def finish_weight_update(self):
        self.calls.append("finish_weight_update")
        if not self._active:
            raise RuntimeError("start_weight_update first")
        self._as_rank()
        try:
            self.engine.finish_weight_update()
        finally:
            self._active = False

    def shutdown(self):
        self.calls.append("shutdown")
        self.engine.shutdown()


def _dynamic_import(path):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


class SglangModelRunner:
    def __init__(self, rank, model, custom_weight_loader):
        self.tp_rank = rank
        self.model = model
        self.custom_weight_loader = custom_weight_loader

    def update_weights_from_tensor(self, named_tensors, load_format=None):
        from sglang.srt.distributed import set_rank_for_harness
        set_rank_for_harness(self.tp_rank)
        if load_format == "direct":
            raise NotImplementedError("the harness has no direct loader")
        elif load_format in self.custom_weight_loader:
            _dynamic_import(load_format)(self.model, named_tensors)
        elif load_format is None:
            self.model.load_weights(named_tensors)
        else:
            raise NotImplementedError(f"Unknown load_format={load_format}")


class SglangEngine:
    def __init__(self, models, custom_weight_loader):
        self.runners = [SglangModelRunner(r, m, custom_weight_loader)
                        for r, m in enumerate(models)]
        self.flushes = 0

    def update_weights_from_tensor(self, named_tensors, load_format=None,
                                   flush_cache=True):
        # One serialized copy of the whole list per rank.
        payloads = [pickle.dumps(named_tensors) for _ in self.runners]
        for runner, payload in zip(self.runners, payloads):
            runner.update_weights_from_tensor(pickle.loads(payload),
                                              load_format)
        if flush_cache:
            self.flushes += 1
