"""CALL-ORDER HARNESS, NOT vLLM: the tensor-parallel rank of the worker the
harness is driving (vllm.distributed.get_tensor_model_parallel_rank)."""

_rank = 0


def get_tensor_model_parallel_rank():
    return _rank


def set_rank_for_harness(rank):
    global _rank
    _rank = rank
