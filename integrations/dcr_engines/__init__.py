"""dcr's inference-engine adapters (integrations/README.md).

dcr_engines.source.WeightSource is the engine-independent part: one serving
rank's weights as its dcr-relay keeps them. dcr_engines.vllm (a vLLM
weight transfer backend) and dcr_engines.sglang (an SGLang custom weight
loader) import their engine; import them only where it is installed.
"""

from dcr_engines.source import StaleStepError, WeightSource

__all__ = ["StaleStepError", "WeightSource"]
