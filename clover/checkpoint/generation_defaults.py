"""`generation_config.json` of a converted checkpoint: the SPEC §2 defaults plus the source's token ids."""

from pathlib import Path

from clover.model.generation_config import SPEC_DEFAULTS, THINK_TOKENS

from .tokenizer_files import token_id


def generation_settings(config, token_ids: dict, src: str | Path) -> dict:
    """SPEC defaults with the config's block size and threshold, the source's eos/pad/bos ids (pad
    falls back to the first eos) and the ids of `<think>` / `</think>` when the tokenizer has them."""
    settings = {**SPEC_DEFAULTS, "block_size": config.block_size,
                "threshold": config.denoising_config.get("threshold", SPEC_DEFAULTS["threshold"])}
    settings.update(token_ids)
    eos = settings.get("eos_token_id")
    if settings.get("pad_token_id") is None and eos is not None:
        settings["pad_token_id"] = eos[0] if isinstance(eos, list) else eos
    for key, token in THINK_TOKENS.items():
        found = token_id(src, token)
        if found is not None:
            settings[key] = found
    return settings


