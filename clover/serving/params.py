"""Per-request decoding settings: the model's `DecodeConfig` plus OpenAI's request semantics.

Resolution and validation are `clover.model.generation_config`'s (request > checkpoint
`generation_config.json` > SPEC defaults); this module only maps OpenAI fields onto them.
"""

from dataclasses import replace

from clover.model.generation_config import DecodeConfig, resolve_config, validate_settings

EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")  # SPEC §10
THINK_TOKENS = ("<think>", "</think>")
REQUEST_NAMES = {"max_new_tokens": "max_tokens"}  # DecodeConfig field -> OpenAI request field


class ParamError(ValueError):
    """An invalid request parameter; `param` names it (OpenAI's `error.param`)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def _token_id(tokenizer, token: str) -> int | None:
    tid = tokenizer.convert_tokens_to_ids(token)
    return tid if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid >= 0 else None


def server_defaults(model, tokenizer) -> DecodeConfig:
    """The model's resolved decoding defaults; EOS and think token ids the checkpoint leaves unset
    come from the tokenizer (the chat format's, SPEC §10), as `clover generate` does."""
    base = resolve_config(getattr(model, "generation_config", None), model.config, {})
    eos = base.eos_token_id or tuple(t for t in (_token_id(tokenizer, s) for s in EOS_TOKENS) if t is not None)
    think_start, think_end = (_token_id(tokenizer, s) for s in THINK_TOKENS)
    return replace(base, eos_token_id=eos,
                   think_start_token_id=_first_set(base.think_start_token_id, think_start),
                   think_end_token_id=_first_set(base.think_end_token_id, think_end))


def _first_set(*values):
    return next((v for v in values if v is not None), None)


def request_config(base: DecodeConfig, overrides: dict, vocab_size: int) -> DecodeConfig:
    """Overlay a request's non-None settings on `base`, then validate.

    OpenAI's `temperature` also switches sampling: > 0 samples, 0 is greedy; without one the
    checkpoint's `do_sample` decides."""
    settings = {k: v for k, v in overrides.items() if v is not None}
    temperature = settings.get("temperature")
    if temperature is not None:
        settings["do_sample"] = temperature > 0
        if temperature == 0:
            settings["temperature"] = base.temperature
    cfg = replace(base, **settings)
    try:
        validate_settings(cfg, vocab_size)
    except ValueError as e:
        name = str(e).split("=", 1)[0]
        raise ParamError(str(e), REQUEST_NAMES.get(name, name)) from e
    return cfg


def default_max_tokens(prompt_len: int, block_size: int, max_positions: int, cap: int) -> int:
    """The largest whole-block budget that fits the context, at most `cap` (0 if none fits)."""
    room = (max_positions - prompt_len) // block_size * block_size
    return max(0, min(cap, room))

