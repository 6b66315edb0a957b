"""CALL-ORDER HARNESS, NOT vLLM: WeightTransferEngineFactory's
register_engine and create_engine signatures of vLLM v0.25.0."""

import importlib


class WeightTransferEngineFactory:
    _registry = {}

    @classmethod
    def register_engine(cls, name, module_path_or_cls, class_name=None):
        if name in cls._registry:
            raise ValueError(f"Weight transfer engine '{name}' is already "
                             "registered")
        if isinstance(module_path_or_cls, str):
            if class_name is None:
                raise ValueError("class_name is required with a module path")
            cls._registry[name] = lambda: getattr(
                importlib.import_module(module_path_or_cls), class_name)
        else:
            cls._registry[name] = lambda: module_path_or_cls

    @classmethod
    def create_engine(cls, config, vllm_config, device, model):
        if config.backend not in cls._registry:
            raise ValueError(
                f"Invalid weight transfer backend: {config.backend}")
        return cls._registry[config.backend]()(config, vllm_config, device,
                                               model)
