"""Decoding settings: SPEC §2 defaults, precedence and validation.

Precedence: keyword argument > the checkpoint's `generation_config.json` > `SPEC_DEFAULTS`.

What counts as "set by the checkpoint": transformers (>= 5) gives every `GenerationConfig` field a
default of `None`, so a field whose value is not `None` was written by `generation_config.json`
(or derived by transformers from `config.json`, e.g. `eos_token_id`). Only those fields are taken;
unknown keys of the JSON (`dllm_*`, `block_size`, `think_*_token_id`) are kept by transformers as
attributes and are read the same way. A value stays a checkpoint value even when it equals a
transformers default, because the comparison is with `None`, not with transformers' defaults.

Every request is checked by `validate_request` before any compute; refusals are `ValueError`s that
name the value and the limit.
"""

import math
from dataclasses import dataclass, fields, replace

import torch

from .configuration_clover_moe import MAX_BLOCK_SIZE
from .generation_block_diffusion import FILL_RULES
from .generation_causal_fallback import FALLBACKS

@dataclass(frozen=True)
class DecodeConfig:
    """All settings of one `generate` call, resolved. Token-id fields may be `None` (absent)."""

    max_new_tokens: int = 24576
    min_new_tokens: int = 0  # EOS is impossible before this response position
    block_size: int = 32
    threshold: float = 0.95
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    presence_penalty: float = 0.9
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.05
    dllm_length_penalty: float = 10.0
    dllm_length_penalty_start: int = 8192
    dllm_length_penalty_window: int = 8192
    dllm_think_end_bias: float = 10.0
    dllm_think_end_start: int = 4096
    dllm_think_end_window: int = 4096
    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int | None = None
    think_start_token_id: int | None = None
    think_end_token_id: int | None = None
    fuse_commit: bool = True
    prefill_chunk_size: int = 4096
    use_coreset: bool | None = None
    coreset_top_p: float | None = None
    mode: str = "block_diffusion"  # or "ar", "self_spec" (SPEC §7)
    draft_steps: int = 1  # self_spec: block-mode passes per draft (k_draft)
    fallback: str = "confidence"  # block_diffusion, no position above the threshold: or "causal"
    fill: str = "threshold"  # block_diffusion: every masked position above the threshold, or "prefix"

    @property
    def pad_id(self) -> int:
        """Padding for finished rows: `pad_token_id`, else the first EOS, else 0."""
        if self.pad_token_id is not None:
            return self.pad_token_id
        return self.eos_token_id[0] if self.eos_token_id else 0


# The SPEC §2 fields a checkpoint's generation_config.json carries; their defaults are DecodeConfig's.
SPEC_FIELDS = ("max_new_tokens", "block_size", "threshold", "do_sample", "temperature", "top_k", "top_p",
               "presence_penalty", "frequency_penalty", "repetition_penalty", "dllm_length_penalty",
               "dllm_length_penalty_start", "dllm_length_penalty_window", "dllm_think_end_bias",
               "dllm_think_end_start", "dllm_think_end_window")
SPEC_DEFAULTS = {f.name: f.default for f in fields(DecodeConfig) if f.name in SPEC_FIELDS}
THINK_TOKENS = {"think_start_token_id": "<think>", "think_end_token_id": "</think>"}
EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")  # the chat format's end tokens (SPEC §10)


def chat_token_ids(tokenizer) -> dict:
    """The chat format's token ids that `tokenizer` has: `eos_token_id` (a list, maybe empty) and
    `think_start_token_id` / `think_end_token_id` (only those present). The one place the
    defaults a checkpoint leaves unset are read from a tokenizer."""
    vocab = tokenizer.get_vocab()
    ids = {"eos_token_id": [vocab[t] for t in EOS_TOKENS if t in vocab]}
    ids.update({name: vocab[token] for name, token in THINK_TOKENS.items() if token in vocab})
    return ids

# Values that mean "off" both here and in transformers, which still warns ("generation flags are not
# valid") when they sit beside `do_sample: false`. Leaving them out of a checkpoint changes nothing:
# an absent field resolves to the same DecodeConfig default.
NEUTRAL_SETTINGS = {"top_k": 0}

FIELDS = {f.name for f in fields(DecodeConfig)}


def without_neutral_settings(settings: dict) -> dict:
    """`settings` without the neutral values of `NEUTRAL_SETTINGS` (what a checkpoint should carry)."""
    return {k: v for k, v in settings.items() if not (k in NEUTRAL_SETTINGS and v == NEUTRAL_SETTINGS[k])}


MODES = ("block_diffusion", "ar", "self_spec")


def _as_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def checkpoint_settings(generation_config) -> dict:
    """The fields of a transformers `GenerationConfig` (or a plain dict) that the checkpoint set."""
    if generation_config is None:
        return {}
    if isinstance(generation_config, dict):
        items = generation_config.items()
    else:
        items = ((name, getattr(generation_config, name, None)) for name in FIELDS)
    return {k: v for k, v in items if k in FIELDS and v is not None}


def resolve_config(generation_config, model_config, kwargs: dict) -> DecodeConfig:
    """keyword > checkpoint generation config > SPEC defaults. `block_size`/`threshold` fall back to
    the model config's `block_size` / `denoising_config` before the SPEC defaults."""
    unknown = sorted(set(kwargs) - FIELDS)
    if unknown:
        raise ValueError(f"unknown generation argument(s) {unknown}; known: {sorted(FIELDS)}")
    settings = dict(SPEC_DEFAULTS)
    if model_config is not None:
        settings["block_size"] = getattr(model_config, "block_size", settings["block_size"])
        denoising = getattr(model_config, "denoising_config", None) or {}
        settings["threshold"] = denoising.get("threshold", settings["threshold"])
        for name in ("eos_token_id", "pad_token_id"):
            if getattr(model_config, name, None) is not None:
                settings[name] = getattr(model_config, name)
    settings.update(checkpoint_settings(generation_config))
    settings.update({k: v for k, v in kwargs.items() if v is not None})
    settings["eos_token_id"] = _as_ids(settings.get("eos_token_id"))
    return replace(DecodeConfig(), **{k: v for k, v in settings.items() if k in FIELDS})


def _refuse(name: str, value, limit: str):
    raise ValueError(f"{name}={value!r} is invalid: {limit}")


def validate_settings(cfg: DecodeConfig, vocab_size: int) -> None:
    """Refuse settings outside their domain (no model state needed)."""
    if cfg.mode not in MODES:
        _refuse("mode", cfg.mode, f"must be one of {list(MODES)}")
    if cfg.block_size <= 0 or MAX_BLOCK_SIZE % cfg.block_size:
        _refuse("block_size", cfg.block_size, f"must divide {MAX_BLOCK_SIZE} (1, 2, 4, 8, 16 or 32)")
    if not 0.0 < cfg.threshold <= 1.0:
        _refuse("threshold", cfg.threshold, "must be in (0, 1]")
    if cfg.max_new_tokens <= 0:
        _refuse("max_new_tokens", cfg.max_new_tokens, "must be a positive integer")
    if not 0 <= cfg.min_new_tokens <= cfg.max_new_tokens:
        _refuse("min_new_tokens", cfg.min_new_tokens, f"must be in [0, max_new_tokens={cfg.max_new_tokens}]")
    if cfg.do_sample and cfg.temperature <= 0:
        _refuse("temperature", cfg.temperature, "must be > 0 when do_sample=True (use do_sample=False)")
    if cfg.top_k < 0:
        _refuse("top_k", cfg.top_k, "must be >= 0 (0 = off)")
    if not 0.0 < cfg.top_p <= 1.0:
        _refuse("top_p", cfg.top_p, "must be in (0, 1]")
    if cfg.repetition_penalty <= 0:
        _refuse("repetition_penalty", cfg.repetition_penalty, "must be > 0 (1.0 = off)")
    if cfg.fallback not in FALLBACKS:
        _refuse("fallback", cfg.fallback, f"must be one of {list(FALLBACKS)}")
    if cfg.fill not in FILL_RULES:
        _refuse("fill", cfg.fill, f"must be one of {list(FILL_RULES)}")
    if cfg.draft_steps <= 0:
        _refuse("draft_steps", cfg.draft_steps, "must be a positive integer")
    if cfg.mode == "self_spec" and cfg.block_size < 2:
        _refuse("block_size", cfg.block_size, "must be >= 2 for self_spec (a draft of one token verifies nothing)")
    if cfg.prefill_chunk_size <= 0:
        _refuse("prefill_chunk_size", cfg.prefill_chunk_size, "must be a positive integer")
    for name in ("pad_token_id", "think_start_token_id", "think_end_token_id"):
        value = getattr(cfg, name)
        if value is not None and not 0 <= value < vocab_size:
            _refuse(name, value, f"must be in [0, vocab_size={vocab_size})")
    for value in cfg.eos_token_id:
        if not 0 <= value < vocab_size:
            _refuse("eos_token_id", value, f"must be in [0, vocab_size={vocab_size})")


def validate_prompt(input_ids: torch.Tensor, attention_mask: torch.Tensor, cfg: DecodeConfig,
                    model_config) -> int:
    """Refuse a prompt batch the model cannot decode; returns the longest prompt length."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"empty prompt: input_ids has shape {tuple(input_ids.shape)}")
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} must equal input_ids "
                         f"shape {tuple(input_ids.shape)}")
    real = attention_mask.bool()
    lengths = real.sum(-1)
    if (lengths == 0).any():
        row = int((lengths == 0).nonzero()[0])
        raise ValueError(f"empty prompt: row {row} has no token with attention_mask=1")
    if (real[:, :-1] & ~real[:, 1:]).any():
        raise ValueError("prompts must be left-padded: attention_mask must be 0s then 1s in every row")
    vocab = model_config.vocab_size
    bad = real & ((input_ids < 0) | (input_ids >= vocab))
    if bad.any():
        value = int(input_ids[bad][0])
        raise ValueError(f"token id {value} is outside the vocabulary [0, vocab_size={vocab})")
    mask_id = model_config.mask_token_id
    if (real & (input_ids == mask_id)).any():
        raise ValueError(f"the prompt contains mask_token_id={mask_id}, which only the decoder may place")
    prompt_len = int(lengths.max())
    step = 1 if cfg.mode == "ar" else cfg.block_size
    reserved = math.ceil(cfg.max_new_tokens / step) * step
    limit = model_config.max_position_embeddings
    if prompt_len + reserved > limit:
        raise ValueError(f"context overflow: prompt length {prompt_len} + {reserved} generated positions "
                         f"(max_new_tokens={cfg.max_new_tokens} rounded up to whole blocks of {step}) "
                         f"> max_position_embeddings={limit}")
    return prompt_len
