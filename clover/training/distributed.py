"""torchrun support: process group from the environment, DDP wrap, rank-0-only side effects.

Under `torchrun` (RANK / WORLD_SIZE / LOCAL_RANK set) `init_distributed` joins the process group
(gloo on CPU, nccl on CUDA); otherwise it returns a single-process `DistInfo` and touches nothing.
Data is sharded by rank in `PairDataset.batch`; only rank 0 writes checkpoints and logs.
"""

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str = "cpu") -> DistInfo:
    """Join the torchrun process group when launched by torchrun; no-op otherwise."""
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) == 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                    int(os.environ.get("LOCAL_RANK", 0)))
    if not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        dist.init_process_group(backend=backend)
    return info


def device_for(info: DistInfo, device: str) -> torch.device:
    """`cuda` means this rank's GPU under torchrun; anything else is used as given."""
    if device == "cuda" and info.enabled:
        return torch.device("cuda", info.local_rank)
    return torch.device(device)


def wrap_ddp(module: torch.nn.Module, info: DistInfo) -> torch.nn.Module:
    """DDP around the loss module (one forward per backward); the module itself when not distributed."""
    if not info.enabled:
        return module
    from torch.nn.parallel import DistributedDataParallel

    device = next(module.parameters()).device
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=ids)


def _comm_device(info: DistInfo) -> torch.device:
    """nccl only moves CUDA tensors; gloo takes CPU ones."""
    return torch.device("cuda", info.local_rank) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce_sum(values: list[float], info: DistInfo) -> list[float]:
    """Sum floats over ranks (identity when not distributed)."""
    if not info.enabled:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device(info))
    dist.all_reduce(t)
    return t.tolist()


def broadcast_flag(flag: bool, info: DistInfo) -> bool:
    """Rank 0's decision for every rank (e.g. a wall-clock stop), so ranks stop at the same step."""
    if not info.enabled:
        return flag
    t = torch.tensor([int(flag)], device=_comm_device(info))
    dist.broadcast(t, src=0)
    return bool(t.item())


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
