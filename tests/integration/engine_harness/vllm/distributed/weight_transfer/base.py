"""CALL-ORDER HARNESS, NOT vLLM.

The signatures of vllm.distributed.weight_transfer.base in vLLM v0.25.0
(https://docs.vllm.ai/en/v0.25.0/api/vllm/distributed/weight_transfer/base/),
with bodies that do what its documentation says and no more.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

TInitInfo = TypeVar("TInitInfo", bound="WeightTransferInitInfo")
TUpdateInfo = TypeVar("TUpdateInfo", bound="WeightTransferUpdateInfo")


@dataclass
class WeightTransferInitInfo(ABC):  # noqa: B024
    pass


@dataclass
class WeightTransferUpdateInfo(ABC):  # noqa: B024
    pass


@dataclass
class WeightTransferInitRequest:
    init_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class WeightTransferUpdateRequest:
    update_info: dict[str, Any] = field(default_factory=dict)


class WeightTransferEngine(ABC, Generic[TInitInfo, TUpdateInfo]):
    init_info_cls: type
    update_info_cls: type

    def __init__(self, config, vllm_config, device, model) -> None:
        self.config = config
        self.vllm_config = vllm_config
        self.parallel_config = getattr(vllm_config, "parallel_config", None)
        self.model_config = getattr(vllm_config, "model_config", None)
        self.device = device
        self.model = model

    def parse_init_info(self, init_dict: dict[str, Any]) -> TInitInfo:
        try:
            return self.init_info_cls(**init_dict)
        except TypeError as e:
            raise ValueError(
                f"Invalid init_info for {self.__class__.__name__}: {e}"
            ) from e

    def parse_update_info(self, update_dict: dict[str, Any]) -> TUpdateInfo:
        try:
            return self.update_info_cls(**update_dict)
        except TypeError as e:
            raise ValueError(
                f"Invalid update_info for {self.__class__.__name__}: {e}"
            ) from e

    @abstractmethod
    def init_transfer_engine(self, init_info: TInitInfo) -> None:
        raise NotImplementedError

    @abstractmethod
    def start_weight_update(self) -> None:
        raise NotImplementedError

    @abstractmethod
    def finish_weight_update(self) -> None:
        raise NotImplementedError

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # vLLM then synchronizes the device; there is none here.
        self.receive_weights(self.parse_update_info(update_info))

    @abstractmethod
    def receive_weights(self, update_info: TUpdateInfo) -> None:
        raise NotImplementedError

    @abstractmethod
    def shutdown(self) -> None:
        raise NotImplementedError

    @staticmethod
    @abstractmethod
    def trainer_send_weights(iterator, trainer_args) -> None:
        raise NotImplementedError
