"""`CloverMoeConfig`: the Qwen3.5-MoE text backbone plus the block-diffusion fields (SPEC §2).

Defaults are the Clover-35B-A3B-Preview values. Inconsistent values raise `ValueError`
naming the field and what is allowed; so do values of the wrong type (the strict dataclass's own
error is re-raised as `ConfigError`, a `ValueError`).
"""

import functools

from huggingface_hub.dataclasses import strict  # a dependency of transformers
from huggingface_hub.errors import StrictDataclassError
from transformers import Qwen3_5MoeTextConfig

ATTENTION_PATTERN = "causal_prefix_bidirectional_block"
MAX_BLOCK_SIZE = 32
LAYER_KINDS = ("linear_attention", "full_attention")


class ConfigError(ValueError):
    """An invalid `CloverMoeConfig` field; the message names the field."""


def _value_errors(cls):
    """Re-raise the strict dataclass's type errors (not `ValueError`s) as `ConfigError`."""
    strict_init = cls.__init__

    @functools.wraps(strict_init)
    def __init__(self, *args, **kwargs):
        try:
            strict_init(self, *args, **kwargs)
        except StrictDataclassError as e:
            raise ConfigError(f"CloverMoeConfig: {e}") from e

    cls.__init__ = __init__
    return cls


@_value_errors
@strict
class CloverMoeConfig(Qwen3_5MoeTextConfig):
    model_type = "clover_moe"

    vocab_size: int = 248320
    max_position_embeddings: int = 131072
    mask_token_id: int = 151669
    block_size: int = 32
    attention_pattern: str = ATTENTION_PATTERN
    denoising_config: dict | None = None
    moe_block_coreset_enabled: bool = True
    moe_block_coreset_top_p: float | int = 0.9  # int so that a JSON `1` loads

    def __post_init__(self, **kwargs):
        if self.rope_parameters is None and "rope_theta" not in kwargs:
            kwargs["rope_theta"] = 10_000_000.0
        if self.denoising_config is None:
            self.denoising_config = {"algorithm": "low_confidence", "threshold": 0.95}
        super().__post_init__(**kwargs)
        validate_config(self)


def _fail(field: str, value, allowed: str):
    raise ConfigError(f"CloverMoeConfig.{field}={value!r} is invalid: {allowed}")


def validate_config(c: CloverMoeConfig) -> None:
    """Raise `ValueError` naming the first inconsistent field."""
    for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "num_experts", "num_experts_per_tok",
                  "linear_num_key_heads", "linear_num_value_heads", "linear_conv_kernel_dim"):
        if getattr(c, field) <= 0:
            _fail(field, getattr(c, field), "must be a positive integer")
    if len(c.layer_types) != c.num_hidden_layers:
        _fail("layer_types", f"<{len(c.layer_types)} entries>",
              f"needs exactly num_hidden_layers={c.num_hidden_layers} entries")
    bad = sorted(set(c.layer_types) - set(LAYER_KINDS))
    if bad:
        _fail("layer_types", bad, f"entries must be one of {list(LAYER_KINDS)}")
    if c.num_attention_heads % c.num_key_value_heads:
        _fail("num_key_value_heads", c.num_key_value_heads,
              f"must divide num_attention_heads={c.num_attention_heads}")
    if c.linear_num_value_heads % c.linear_num_key_heads:
        _fail("linear_num_key_heads", c.linear_num_key_heads,
              f"must divide linear_num_value_heads={c.linear_num_value_heads}")
    if c.num_experts_per_tok > c.num_experts:
        _fail("num_experts_per_tok", c.num_experts_per_tok, f"must be <= num_experts={c.num_experts}")
    if c.block_size <= 0 or MAX_BLOCK_SIZE % c.block_size:
        _fail("block_size", c.block_size, f"must divide {MAX_BLOCK_SIZE} (1, 2, 4, 8, 16 or 32)")
    if not 0 <= c.mask_token_id < c.vocab_size:
        _fail("mask_token_id", c.mask_token_id, f"must be in [0, vocab_size={c.vocab_size})")
    if c.attention_pattern != ATTENTION_PATTERN:
        _fail("attention_pattern", c.attention_pattern, f"the only pattern is {ATTENTION_PATTERN!r}")
    if not 0.0 < c.moe_block_coreset_top_p <= 1.0:
        _fail("moe_block_coreset_top_p", c.moe_block_coreset_top_p, "must be in (0, 1]")
    threshold = c.denoising_config.get("threshold", 0.95)
    if not 0.0 < threshold <= 1.0:
        _fail("denoising_config.threshold", threshold, "must be in (0, 1]")
    rotary = c.rope_parameters.get("partial_rotary_factor", 1.0)
    if int(c.head_dim * rotary) % 2:
        _fail("partial_rotary_factor", rotary, f"head_dim*factor must be even (head_dim={c.head_dim})")
