"""Language-model training: TrainConfig and train() (one process, DDP, FSDP2), exact resume."""

from fpa.train.config import TrainConfig
from fpa.train.loop import train

__all__ = ["TrainConfig", "train"]
