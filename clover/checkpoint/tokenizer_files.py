"""Tokenizer files of a converted checkpoint: copied from the source, with `<|mask|>` registered as
a special token at the mask id (SPEC §10; the surgery is in `mask_token`).
"""

import json
import shutil
from pathlib import Path

from tokenizers import Tokenizer

from transformers.utils import logging

from .mask_token import ADDED_FLAGS, MASK_TOKEN, place_mask

logger = logging.get_logger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json")
# the slow tokenizer's files: left out beside tokenizer.json, which alone carries the mask placement
SLOW_FILES = ("vocab.json", "merges.txt")


def next_free_id(src: str | Path) -> int | None:
    """The id `tokenizers` gives a new token (one past the largest), or None without tokenizer.json."""
    path = Path(src) / "tokenizer.json"
    if not path.is_file():
        return None
    return max(Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True).values()) + 1


def token_id(src: str | Path, token: str) -> int | None:
    path = Path(src) / "tokenizer.json"
    return Tokenizer.from_file(str(path)).token_to_id(token) if path.is_file() else None


def _update_tokenizer_config(config: dict, mask_id: int) -> dict:
    decoder = {k: v for k, v in config.get("added_tokens_decoder", {}).items()
               if v.get("content") != MASK_TOKEN or int(k) == mask_id}
    decoder[str(mask_id)] = {"content": MASK_TOKEN, **ADDED_FLAGS}
    config["added_tokens_decoder"] = dict(sorted(decoder.items(), key=lambda kv: int(kv[0])))
    config["mask_token"] = MASK_TOKEN
    return config


def _rewrite_json(path: Path, edit) -> None:
    path.write_text(json.dumps(edit(json.loads(path.read_text())), indent=2, ensure_ascii=False) + "\n")


def _place_mask_file(path: Path, mask_id: int) -> None:
    placement = place_mask(json.loads(path.read_text()), mask_id)
    if placement.replaced is not None:
        logger.warning(f"{MASK_TOKEN} replaces the token {placement.replaced!r} at id {mask_id}; "
                       f"{len(placement.dropped_merges)} BPE merges that produce or use it are removed, "
                       "so its text is encoded through shorter tokens")
    path.write_text(json.dumps(placement.tokenizer, indent=2, ensure_ascii=False) + "\n")


def copy_tokenizer(src: str | Path, dst: str | Path, mask_id: int) -> list[str]:
    """Copy the tokenizer files of `src` into `dst` with `<|mask|>` at `mask_id`; return their names."""
    src, dst = Path(src), Path(dst)
    copied = [name for name in TOKENIZER_FILES if (src / name).is_file()]
    if "tokenizer.json" in copied:
        copied = [name for name in copied if name not in SLOW_FILES]
    for name in copied:
        shutil.copy2(src / name, dst / name)
    if "tokenizer.json" in copied:
        _place_mask_file(dst / "tokenizer.json", mask_id)
    if "tokenizer_config.json" in copied:
        _rewrite_json(dst / "tokenizer_config.json", lambda c: _update_tokenizer_config(c, mask_id))
    if "special_tokens_map.json" in copied:
        _rewrite_json(dst / "special_tokens_map.json", lambda m: {**m, "mask_token": MASK_TOKEN})
    return copied
