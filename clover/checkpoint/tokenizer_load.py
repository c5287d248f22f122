"""Load a checkpoint's tokenizer so that no text can encode to the mask id (SPEC §10).

A checkpoint converted by `clover convert` already has `<|mask|>` as a special added token at its
mask id. Any other one (a release whose tokenizer keeps Qwen3.5's `' それ'` at 151669, a hand-made
directory) is checked here: when text can encode to the mask id, the tokenizer is fixed in memory
exactly as `clover convert` fixes the file (`mask_token.place_mask`) and one warning says so.
"""

import json
from pathlib import Path

from tokenizers import Tokenizer
from transformers import AutoTokenizer
from transformers.utils import logging

from .mask_token import MASK_TOKEN, place_mask

logger = logging.get_logger(__name__)


def _ordinary_token_at(backend: Tokenizer, mask_id: int) -> str | None:
    """Cheap check on the backend: the model-vocabulary or added token at `mask_id` that text can
    produce (anything but the special `<|mask|>`), or None."""
    added = backend.get_added_tokens_decoder().get(mask_id)
    if added is not None and (added.content != MASK_TOKEN or not added.special):
        return added.content
    in_model = backend.model.id_to_token(mask_id)
    return in_model if in_model not in (None, MASK_TOKEN) else None


def ensure_mask_token(tokenizer, mask_id: int, source: str = "the tokenizer"):
    """Make `tokenizer` (a transformers fast tokenizer) unable to encode text to `mask_id`, in place;
    return it. Warns once, naming the token it replaced, when a fix was needed."""
    backend = tokenizer.backend_tokenizer
    replaced = _ordinary_token_at(backend, mask_id)
    if replaced is None:
        return tokenizer
    placement = place_mask(json.loads(backend.to_str()), mask_id)
    tokenizer._tokenizer = Tokenizer.from_str(json.dumps(placement.tokenizer))
    tokenizer.mask_token = MASK_TOKEN
    logger.warning(f"{source} encodes the text {replaced!r} to the mask id {mask_id}; fixed in memory: "
                   f"{MASK_TOKEN} replaces it as a special token and {len(placement.dropped_merges)} BPE "
                   "merges that produce or use it are removed (convert the checkpoint with `clover convert` "
                   "to fix the file)")
    return tokenizer


def _config_mask_id(directory: Path) -> int | None:
    path = directory / "config.json"
    return json.loads(path.read_text()).get("mask_token_id") if path.is_file() else None


def load_tokenizer(directory: str | Path, mask_token_id: int | None = None, **kwargs):
    """`AutoTokenizer.from_pretrained(directory, **kwargs)` with the mask id made unreachable from text.
    `mask_token_id` defaults to the checkpoint's config.json; without one the tokenizer is returned
    as loaded."""
    directory = Path(directory)
    tokenizer = AutoTokenizer.from_pretrained(str(directory), **kwargs)
    mask_id = _config_mask_id(directory) if mask_token_id is None else mask_token_id
    if mask_id is None:
        return tokenizer
    return ensure_mask_token(tokenizer, mask_id, source=f"the tokenizer of {directory}")
