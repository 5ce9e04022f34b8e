"""Language-model training: TrainConfig and train() (one process, DDP, FSDP2), exact resume."""

from fpa.train.config import TrainConfig
from fpa.train.loop import train
from fpa.train.model_setup import parameter_groups

__all__ = ["TrainConfig", "parameter_groups", "train"]
