"""CALL-ORDER HARNESS, NOT vLLM: vLLM's layerwise reload entry points,
recording their calls (calls: list of (function name, model))."""

calls = []


def initialize_layerwise_reload(model):
    calls.append(("initialize_layerwise_reload", model))


def finalize_layerwise_reload(model, model_config):
    calls.append(("finalize_layerwise_reload", model))
