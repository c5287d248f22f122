"""How the model is spread over ranks: `"ddp"` (a full replica per rank, gradients all-reduced)
or `"fsdp"` (PyTorch FSDP2, `fully_shard`: parameters, gradients and optimizer state split over
ranks, each decoder layer gathered just for its own forward and backward).

FSDP2 units: every decoder layer, then the root (embeddings, final norm, head). The loss runs one
forward per block on a shared cache before a single backward; FSDP2 gathers a layer's weights for
each of those forwards and sums its gradient contributions before the reduce-scatter. With
`dtype="bf16"` the gathered weights are bf16 and gradients are reduced in fp32 over fp32 master
shards (mixed precision); `"fp32"` is exact.

FSDP2 cannot shard 0-dim parameters (the GDN block-mode scalars): they stay whole on every rank,
outside FSDP, and `sync_replicated_grads` averages their gradients like DDP would.
"""

import torch

from .distributed import DistInfo, wrap_ddp

STRATEGIES = ("ddp", "fsdp")


def shard_fsdp(model: torch.nn.Module, dtype: str = "fp32") -> list[torch.nn.Parameter]:
    """Apply `fully_shard` per decoder layer and to the root (in place); returns the parameters
    left replicated (0-dim), whose gradients the caller averages with `sync_replicated_grads`."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy()
    if dtype == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    replicated = [p for p in model.parameters() if p.dim() == 0]
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy, ignored_params=set(replicated))
    fully_shard(model, mp_policy=policy, ignored_params=set(replicated))
    return replicated


def sync_replicated_grads(params: list[torch.nn.Parameter], info: DistInfo) -> None:
    """Average the gradients of parameters FSDP left whole (one all-reduce for all of them)."""
    import torch.distributed as dist

    grads = [p.grad for p in params if p.grad is not None]
    if not grads or not info.enabled:
        return
    flat = torch.cat([g.reshape(1) for g in grads])
    dist.all_reduce(flat)
    flat /= info.world_size
    for g, value in zip(grads, flat):
        g.copy_(value)


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def distribute(loss_module: torch.nn.Module, model: torch.nn.Module, strategy: str,
               info: DistInfo) -> torch.nn.Module:
    """The module the trainer calls: DDP around the loss module, or the loss module itself when
    the model is FSDP-sharded (FSDP2 lives on the model's own modules) or not distributed."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} must be one of {STRATEGIES}")
    if strategy == "fsdp" or not info.enabled:
        return loss_module
    return wrap_ddp(loss_module, info)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer as a whole CPU tensor, a copy: training on does not change it.
    Collective under FSDP: every rank calls it, rank 0 gets the tensors, the others an empty dict.

    Under FSDP the shards are gathered into new tensors, but what FSDP left whole (the 0-dim
    parameters, buffers) comes back as the live CPU tensor itself, so those are copied."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.tensor import DTensor

    if not is_sharded(model):
        return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                                  broadcast_from_rank0=False))
    live = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]
            if not isinstance(t, DTensor)}
    return {k: v.clone() if v.untyped_storage().data_ptr() in live else v for k, v in state.items()}


def clip_gradients(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Scale gradients to a global norm of at most `max_norm`; returns the norm before. Under
    FSDP the sharded gradients (DTensors) and the replicated ones are normed apart and combined."""
    from torch.distributed.tensor import DTensor

    sharded = [p.grad for p in params if isinstance(p.grad, DTensor)]
    if not sharded:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    plain = [p.grad for p in params if p.grad is not None and not isinstance(p.grad, DTensor)]
    squared = torch.nn.utils.get_total_norm(sharded).full_tensor() ** 2
    if plain:
        squared = squared + torch.nn.utils.get_total_norm(plain).to(squared.device) ** 2
    total = float(squared.sqrt())
    coef = min(1.0, max_norm / (total + 1e-6))
    if coef < 1.0:
        for g in sharded + plain:
            g.mul_(coef)
    return total


def local_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes this rank holds for parameters and optimizer state (its shards under FSDP)."""
    from torch.distributed.tensor import DTensor

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    tensors = [local(p) for p in model.parameters()]
    tensors += [local(v) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return sum(t.numel() * t.element_size() for t in tensors)
