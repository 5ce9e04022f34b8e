"""Process group, device and model wrapping: single process, DDP, or FSDP2 (``fully_shard``).

Launched by ``torchrun`` (WORLD_SIZE > 1) the process group uses nccl on CUDA and gloo on CPU.
State dicts are always gathered to full, CPU tensors so a checkpoint can be resumed under any
world size or parallelism.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class Dist:
    """This process's place in the run: ranks, device, parallelism, and whether ``setup`` began the group."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    parallel: str = "none"  # none | ddp | fsdp
    initialized_here: bool = False

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the process that logs and writes files."""
        return self.rank == 0


def setup(device: str, parallel: str) -> Dist:
    """Read torchrun's environment, pick the device and init the process group if needed."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device must be 'cpu' or 'auto' here: CUDA is not available")
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    if parallel == "auto":
        parallel = "ddp" if world > 1 else "none"
    if world == 1 and parallel != "none":
        parallel = "none"  # nothing to shard or replicate over
    if world > 1 and parallel == "none":
        raise ValueError(f"parallel must be 'ddp', 'fsdp' or 'auto' under torchrun (WORLD_SIZE={world})")
    here = False
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
        here = True
    return Dist(rank, world, local, dev, parallel, here)


def wrap(model: nn.Module, d: Dist) -> nn.Module:
    """DDP or FSDP2 (each TransformerBlock sharded, then the root) around a model on ``d.device``."""
    if d.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[d.local_rank] if d.device.type == "cuda" else None)
    if d.parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        layers = model.get_submodule("model.layers")
        if not isinstance(layers, nn.ModuleList):
            raise TypeError(f"model.model.layers must be an nn.ModuleList for FSDP, got {type(layers).__name__}")
        for layer in layers:
            fully_shard(layer)
        fully_shard(model)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DDP wrapper (its ``.module``); any other model as is."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, nn.Module) and not hasattr(model, "config") else model


def _cpu(t):
    return t.detach().cpu() if torch.is_tensor(t) else t


def full_model_state(model: nn.Module, d: Dist) -> dict:
    """The model's state dict as full CPU tensors (a collective under FSDP)."""
    if d.parallel == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: _cpu(v) for k, v in unwrap(model).state_dict().items()}


def full_state(model: nn.Module, opt: torch.optim.Optimizer, d: Dist) -> tuple[dict, dict]:
    """(model state, optimizer state) as full CPU tensors (a collective under FSDP)."""
    if d.parallel == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        return get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    msd = full_model_state(model, d)
    osd = opt.state_dict()
    osd = {
        "state": {k: {n: _cpu(t) for n, t in s.items()} for k, s in osd["state"].items()},
        "param_groups": osd["param_groups"],
    }
    return msd, osd


def load_full_state(model: nn.Module, opt: torch.optim.Optimizer, msd: dict, osd: dict, d: Dist) -> None:
    """Load full (model, optimizer) state dicts, as ``full_state`` returns them, into a possibly wrapped model."""
    if d.parallel == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(
            model, opt, model_state_dict=msd, optim_state_dict=osd, options=StateDictOptions(full_state_dict=True)
        )
        return
    unwrap(model).load_state_dict(msd)
    opt.load_state_dict(osd)


def all_reduce_sum(values: list[float], d: Dist) -> list[float]:
    """Element-wise sum of ``values`` over all ranks (a collective; the values as is on one process)."""
    if d.world_size == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=d.device)
    dist.all_reduce(t)
    return t.tolist()


def teardown(d: Dist) -> None:
    """Destroy the process group if ``setup`` created it."""
    if d.initialized_here and dist.is_initialized():
        dist.destroy_process_group()
