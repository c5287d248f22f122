"""Model facts without weights: parameter counts, memory footprints and the layer layout of a config.

The model is built on the meta device, so even the 35B preset costs no memory. Definitions:

- total parameters: every distinct parameter tensor (tied weights once).
- active parameters per token: what one token's forward reads. The embedding contributes one row
  (a lookup), every routed-expert stack `top_k / num_experts` of its size, every other module (token
  mixer, router, shared expert and its gate, norms, lm_head) all of its parameters.
- bf16 bytes: 2 bytes per parameter.
- int8 / int4 bytes: exact, in `clover quantize`'s format (`clover.quantization.quantized_bytes`,
  counted on the meta device): the weights that format quantizes (experts, shared expert, attention
  and GDN projections) as 8- or 4-bit values plus bf16 scales (and, for int4, zeros) per group of
  `group_size` inputs; everything else (embeddings, lm_head, router, gates, conv, norms, block-mode
  scalars) in bf16.
- fits: whether the weights alone fit a GPU of that many GB (1e9 bytes); the KV cache, GDN states
  and activations need room beyond them.
"""

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from .model import CloverMoeConfig, CloverMoeForCausalLM
from .model.moe import Experts

PRESETS = {"clover-35b-a3b": {}}  # the config defaults are the Clover-35B-A3B-Preview values
BF16_BYTES = 2
GPU_SIZES_GB = (16, 24)


@dataclass(frozen=True)
class ModelInfo:
    total_params: int
    active_params: int
    bytes_bf16: int
    bytes_int8: int | None  # None: the group size does not divide every quantized width
    bytes_int4: int | None
    group_size: int
    layer_pattern: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_experts: int
    experts_per_token: int
    shared_expert: bool
    max_position_embeddings: int
    mask_token_id: int
    block_size: int
    attention_pattern: str
    denoising: dict
    coreset_enabled: bool
    coreset_top_p: float

    def to_dict(self) -> dict:
        return asdict(self)


def preset_config(name: str) -> CloverMoeConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return CloverMoeConfig(**PRESETS[name])


def config_from_dir(path: str | Path) -> CloverMoeConfig:
    """Read only `config.json` of a checkpoint directory (a Qwen3.5-MoE backbone's `text_config`
    is accepted too)."""
    file = Path(path) / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"no config.json in {path}")
    raw = json.loads(file.read_text())
    raw = raw.get("text_config", raw)
    raw = {k: v for k, v in raw.items() if k not in ("model_type", "architectures", "auto_map")}
    return CloverMoeConfig(**raw)


def meta_model(config: CloverMoeConfig) -> CloverMoeForCausalLM:
    """The model with every tensor on the meta device (shapes only, no storage)."""
    with torch.device("meta"):
        return CloverMoeForCausalLM(config)


def layer_pattern(layer_types: list[str]) -> str:
    """Shortest repeating unit, run-length encoded: `(3×linear_attention, full_attention)×10`."""
    n = len(layer_types)
    period = next(p for p in range(1, n + 1) if n % p == 0 and layer_types == layer_types[:p] * (n // p))
    runs: list[list] = []
    for kind in layer_types[:period]:
        if runs and runs[-1][0] == kind:
            runs[-1][1] += 1
        else:
            runs.append([kind, 1])
    unit = ", ".join(kind if count == 1 else f"{count}×{kind}" for kind, count in runs)
    repeats = n // period
    if repeats == 1:
        return unit
    return f"({unit})×{repeats}" if len(runs) > 1 else f"{unit}×{repeats}"


def count(model: nn.Module, top_k: int) -> dict:
    """Totals over the model's parameters (see the module docstring for the definitions)."""
    seen: set[int] = set()
    total = active = 0
    for module in model.modules():
        for param in module.parameters(recurse=False):
            if isinstance(module, nn.Embedding):
                active += module.embedding_dim  # one row per token
            elif isinstance(module, Experts):
                active += param.numel() * top_k // module.num_experts
            else:
                active += param.numel()
            if id(param) in seen:
                continue
            seen.add(id(param))
            total += param.numel()
    return dict(total_params=total, active_params=active, bytes_bf16=total * BF16_BYTES)


def _quantized_or_none(config: CloverMoeConfig, bits: int, group_size: int) -> int | None:
    from .quantization import quantized_bytes

    try:
        return quantized_bytes(config, bits, group_size)
    except ValueError:  # a width the group size does not divide: not quantizable at this group size
        return None


def model_info(config: CloverMoeConfig, group_size: int = 128) -> ModelInfo:
    counts = count(meta_model(config), config.num_experts_per_tok)
    return ModelInfo(
        **counts,
        bytes_int8=_quantized_or_none(config, 8, group_size),
        bytes_int4=_quantized_or_none(config, 4, group_size),
        group_size=group_size,
        layer_pattern=layer_pattern(list(config.layer_types)),
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        vocab_size=config.vocab_size,
        num_experts=config.num_experts,
        experts_per_token=config.num_experts_per_tok,
        shared_expert=config.shared_expert_intermediate_size > 0,
        max_position_embeddings=config.max_position_embeddings,
        mask_token_id=config.mask_token_id,
        block_size=config.block_size,
        attention_pattern=config.attention_pattern,
        denoising=dict(config.denoising_config),
        coreset_enabled=config.moe_block_coreset_enabled,
        coreset_top_p=float(config.moe_block_coreset_top_p),
    )


def _human(n: float, unit: str = "") -> str:
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{suffix}{unit}"
    return f"{n:.0f}{unit}"


def weight_bytes(info: ModelInfo, bits: int) -> int:
    return {16: info.bytes_bf16, 8: info.bytes_int8, 4: info.bytes_int4}[bits]


def format_info(info: ModelInfo, bits: int | None = None) -> str:
    gb = 1e9
    shown = (bits,) if bits else (16, 8, 4)
    names = {16: "bf16", 8: f"int8, group {info.group_size}", 4: f"int4, group {info.group_size}"}
    fits = lambda b: " / ".join(f"{'fits' if weight_bytes(info, b) <= size * gb else 'exceeds'} {size} GB"
                                for size in GPU_SIZES_GB)
    size = lambda b: (f"{weight_bytes(info, b) / gb:.2f} GB {names[b]}: {fits(b)}" if weight_bytes(info, b)
                      else f"{names[b]}: not quantizable (the group size does not divide every quantized width)")
    lines = [
        f"parameters        {_human(info.total_params)} total, {_human(info.active_params)} active per token",
        *(f"{'weights' if i == 0 else '':<18}{size(b)}" for i, b in enumerate(shown)),
        f"layers            {info.num_layers}: {info.layer_pattern}",
        f"hidden / vocab    {info.hidden_size} / {info.vocab_size}",
        f"experts           {info.num_experts} routed, top-{info.experts_per_token}"
        + (" + 1 shared" if info.shared_expert else ""),
        f"context           {info.max_position_embeddings} positions",
        f"block diffusion   block {info.block_size}, mask id {info.mask_token_id}, {info.attention_pattern}, "
        f"{info.denoising.get('algorithm')} threshold {info.denoising.get('threshold')}",
        f"block coreset     {'on' if info.coreset_enabled else 'off'}, top_p {info.coreset_top_p}",
        "(active = one embedding row + every non-expert parameter incl. lm_head + top-k/num_experts "
        "of the routed experts; GB = 1e9 bytes of weights only, in clover quantize's format)",
    ]
    return "\n".join(lines)
