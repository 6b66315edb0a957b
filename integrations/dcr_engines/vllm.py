"""dcr as a vLLM weight transfer backend (vLLM v0.25.0).

Written against vLLM v0.25.0's documented interface
(https://docs.vllm.ai/en/v0.25.0/training/weight_transfer/base/):
vllm.distributed.weight_transfer.base.WeightTransferEngine, whose engines
are built by WeightTransferEngineFactory.create_engine(config, vllm_config,
device, model) in each worker and driven by the worker's
init_weight_transfer_engine -> (start_weight_update -> update_weights ... ->
finish_weight_update)* -> shutdown. The interface changes between vLLM
releases (v0.16 passed load_weights to receive_weights and had no
start/finish; v0.26 added draft-model targets): check it before using this
with another version. Not tested against vLLM itself, which these machines
cannot install; see integrations/README.md for what is tested.

Use (each worker must import this module, so register it in a vLLM
general plugin, or import it in a worker extension):

    vllm serve MODEL --tensor-parallel-size 2 \\
        --weight-transfer-config '{"backend": "dcr"}'

    # once, from the trainer side:
    POST /init_weight_transfer_engine {"init_info": {
        "store": "shm:/dcr-serve-{rank}", "socket": "/run/dcr/s{rank}.sock",
        "mode": "direct"}}
    # after each `dcr refit` (or trainer_send_weights) committed step N:
    POST /start_weight_update
    POST /update_weights {"update_info": {"step": N}}
    POST /finish_weight_update

Modes:
- "direct": the relay keeps the rank's store in vLLM's own layout (a
  serving layout of vLLM's parameter names: fused qkv_proj and
  gate_up_proj, the rank's slice, FP8 codes and scales; docs/PLACEMENT.md),
  and receive_weights copies it into the parameters in place, bit for bit,
  with no loader: the parameters keep their storage.
- "load_weights": the relay keeps the canonical checkpoint, and
  receive_weights hands its tensors to model.load_weights inside vLLM's
  layerwise reload (start/finish_weight_update), which fuses, slices and
  quantizes as at startup.
"""

from dataclasses import dataclass, field

from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import \
    WeightTransferEngineFactory

from dcr_engines.source import WeightSource, load_weights

BACKEND = "dcr"
MODES = ("direct", "load_weights")


@dataclass
class DcrInitInfo(WeightTransferInitInfo):
    # The rank's store as its relay was given it; "{rank}" becomes the
    # worker's tensor-parallel rank.
    store: str = ""
    # The relay's serving socket ("{rank}" as above; empty: none).
    socket: str = ""
    mode: str = "direct"
    # Seconds to wait for the relay's first commit.
    wait_s: float = 60.0
    # direct: patterns (Python re) of parameters the store need not feed,
    # e.g. ["\\.(q|k|v|prob)_scale$"] for an FP8 KV cache's scales.
    ignore: list = field(default_factory=list)


@dataclass
class DcrUpdateInfo(WeightTransferUpdateInfo):
    # The committed step to load: every tensor-parallel rank loads this
    # one (required, so that no two ranks load different steps).
    step: int = -1
    # Seconds to wait for the relay to commit it.
    timeout_s: float = 300.0


class DcrWeightTransferEngine(WeightTransferEngine[DcrInitInfo,
                                                   DcrUpdateInfo]):
    init_info_cls = DcrInitInfo
    update_info_cls = DcrUpdateInfo

    def __init__(self, config, vllm_config, device, model):
        super().__init__(config, vllm_config, device, model)
        self.source = None
        self.mode = None
        self.last = None  # the last update: {"step", "tensors", "bytes", "seconds"}

    def init_transfer_engine(self, init_info):
        if init_info.mode not in MODES:
            raise ValueError("dcr: mode '%s'; expected one of %s" %
                             (init_info.mode, ", ".join(MODES)))
        if not init_info.store:
            raise ValueError("dcr: init_info needs the rank's store, e.g. "
                             "'shm:/dcr-serve-{rank}'")
        rank = _tp_rank()
        self.shutdown()  # a second init replaces the first
        self.mode = init_info.mode
        self.ignore = list(init_info.ignore)
        self.source = WeightSource(init_info.store.format(rank=rank),
                                   socket=init_info.socket.format(rank=rank),
                                   wait=init_info.wait_s)

    def start_weight_update(self):
        # An update that failed in receive_weights never reached finish:
        # vLLM's worker ends it without one. Nothing of it is held.
        self._require_source().release()
        if self.mode == "load_weights":
            from vllm.model_executor.model_loader.reload import \
                initialize_layerwise_reload
            initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info):
        source = self._require_source()
        if update_info.step < 0:
            raise ValueError("dcr: update_info needs the committed step, "
                             "e.g. {\"step\": 12}")
        # Any failure ends the update (vLLM's worker calls no finish then):
        # the source lets go of its image, the engine keeps what it had
        # (copy_into checks everything before it copies).
        try:
            step = source.acquire(update_info.step,
                                  timeout=update_info.timeout_s)
            if self.mode == "direct":
                stats = source.copy_into(dict(self.model.named_parameters()),
                                         ignore=self.ignore)
            else:
                stats = load_weights(source, self.model)
        except Exception:
            source.release()
            raise
        self.last = dict(stats, step=step)

    def finish_weight_update(self):
        source = self._require_source()
        try:
            if self.mode == "load_weights":
                from vllm.model_executor.model_loader.reload import \
                    finalize_layerwise_reload
                finalize_layerwise_reload(self.model, self.model_config)
        finally:
            source.release()

    def shutdown(self):
        if self.source is not None:
            self.source.close()
            self.source = None

    @staticmethod
    def trainer_send_weights(iterator, trainer_args):
        """One dcr refit of a trainer rank's shards: trainer_args is
        {"producer": dcr.Producer, "step": N} (docs/PYTHON.md); `iterator`
        gives the rank's (shard name, tensor) pairs. Returns the decision;
        RuntimeError unless the tree committed. Then call the engine's
        update with {"step": N}."""
        producer, step = trainer_args["producer"], trainer_args["step"]
        decision = producer.refit(step, dict(iterator))
        if not decision["committed"]:
            raise RuntimeError("dcr refit of step %d: %s: %s" %
                               (step, decision["outcome"], decision["reason"]))
        return decision

    def _require_source(self):
        if self.source is None:
            raise RuntimeError("dcr: init_weight_transfer_engine first")
        return self.source


def _tp_rank():
    from vllm.distributed import get_tensor_model_parallel_rank
    return get_tensor_model_parallel_rank()


def register():
    """Registers the backend as "dcr" (once per process; a vLLM general
    plugin's entry point, so that every worker has it)."""
    try:
        WeightTransferEngineFactory.register_engine(
            BACKEND, "dcr_engines.vllm", "DcrWeightTransferEngine")
    except ValueError:
        pass  # registered already
