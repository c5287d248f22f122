"""Export a trained model as a Clover checkpoint directory (SPEC §9): weights + config through the
model's own `save_pretrained`, plus `generation_config.json` and the tokenizer files."""

import copy
from pathlib import Path

import torch

from clover.model.checkpoint_save import write_generation_config
from clover.model.generation_config import SPEC_DEFAULTS, THINK_TOKENS, chat_token_ids


def generation_config(config, eos_ids: tuple[int, ...], pad_id: int, block_size: int) -> dict:
    """The defaults, with EOS/pad ids, the trained block size, and max_new_tokens capped at half
    the context so a default request fits a small model's context window."""
    return {**SPEC_DEFAULTS, "block_size": block_size, "eos_token_id": list(eos_ids),
            "pad_token_id": pad_id,
            "max_new_tokens": min(SPEC_DEFAULTS["max_new_tokens"], config.max_position_embeddings // 2)}


def export_checkpoint(model, directory: str | Path, eos_ids: tuple[int, ...], pad_id: int,
                      block_size: int, tokenizer=None, dtype: str = "fp32",
                      generation: dict | None = None) -> Path:
    """Write the checkpoint; `dtype="bf16"` stores bf16 weights (the live model is left as it is);
    `generation` overrides generation_config.json values."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.config.eos_token_id = list(eos_ids)
    model.config.pad_token_id = pad_id
    if dtype == "bf16":  # a copy, so the live fp32 weights are not rounded
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(directory)
    else:
        model.save_pretrained(directory)
    values = {**generation_config(model.config, eos_ids, pad_id, block_size), **(generation or {})}
    if tokenizer is not None:
        values |= {name: id_ for name, id_ in chat_token_ids(tokenizer).items() if name in THINK_TOKENS}
    write_generation_config(directory, values)
    if tokenizer is not None:
        from clover.data.tokenizer import save_tokenizer

        save_tokenizer(tokenizer, directory)
    return directory
