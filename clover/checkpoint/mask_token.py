"""`<|mask|>` at a given id of a `tokenizer.json` (SPEC §10): surgery on the JSON content.

`tokenizers` gives a new added token the next free id, whatever id the JSON says, so the mask token
is placed by renaming the token already at that id (an added token, or an entry of the model's
vocabulary) or by appending it when the id is the next free one.

A BPE vocabulary entry at the mask id (Qwen3.5's `' それ'` at 151669) is an ordinary token that text
encodes to. Renaming it removes it from the model's vocabulary, so every merge that mentions it goes
too: the merges that produce it (its text is then encoded through the shorter tokens it was made of
and still decodes back exactly) and the merges that use it (their results can no longer be formed
from it; texts containing them also fall back to shorter tokens). Every merge that never touches
the old token keeps its rank, so a text whose encoding never formed the old token encodes exactly as
before. The mask token itself is a special added token, matched only as the literal `<|mask|>`.
"""

import json
from dataclasses import dataclass

from tokenizers import Tokenizer

MASK_TOKEN = "<|mask|>"
ADDED_FLAGS = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}


@dataclass(frozen=True)
class MaskPlacement:
    tokenizer: dict  # the new tokenizer.json content
    replaced: str | None  # the ordinary token that sat at the mask id (None: none did)
    dropped_merges: list[tuple[str, str]]  # BPE merges removed with it


def model_vocab_ids(model: dict) -> dict[int, str]:
    """id -> token of the tokenizer model's own vocabulary (dict vocab, or Unigram's list)."""
    vocab = model.get("vocab") or {}
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        return {i: piece for i, (piece, _) in enumerate(vocab)}
    return {i: token for token, i in vocab.items()}


def _merge_pair(merge) -> tuple[str, str]:
    """A merge as stored: "left right" (older files) or [left, right]."""
    left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
    return left, right


def ordinary_token_at(tokenizer: dict, mask_id: int) -> str | None:
    """The token that text can encode to at `mask_id`: a model vocabulary entry other than
    `<|mask|>`, or an added token other than the special `<|mask|>`; None when there is none."""
    vocab = model_vocab_ids(tokenizer["model"])
    if vocab.get(mask_id, MASK_TOKEN) != MASK_TOKEN:
        return vocab[mask_id]
    for added in tokenizer.get("added_tokens", []):
        if added["id"] == mask_id and (added["content"] != MASK_TOKEN or not added.get("special")):
            return added["content"]
    return None


def _drop_merges(model: dict, token: str) -> list[tuple[str, str]]:
    """Remove every merge that produces or uses `token`; return them."""
    kept, dropped = [], []
    for merge in model.get("merges") or []:
        left, right = _merge_pair(merge)
        (dropped if token in (left, right, left + right) else kept).append(merge)
    model["merges"] = kept
    return [_merge_pair(m) for m in dropped]


def _rename_vocab_entry(model: dict, mask_id: int, old: str) -> list[tuple[str, str]]:
    dropped = _drop_merges(model, old) if model.get("type") == "BPE" else []
    if isinstance(model["vocab"], list):
        model["vocab"][mask_id][0] = MASK_TOKEN
    else:
        del model["vocab"][old]
        model["vocab"][MASK_TOKEN] = mask_id
    return dropped


def _copy_for_edit(tokenizer: dict) -> dict:
    """A copy of the parts `place_mask` edits (the vocabulary, merges and added tokens); the rest is shared."""
    model = dict(tokenizer["model"])
    vocab = model.get("vocab") or {}
    model["vocab"] = [list(entry) for entry in vocab] if isinstance(vocab, list) else dict(vocab)
    if "merges" in model:
        model["merges"] = list(model["merges"])
    return {**tokenizer, "model": model, "added_tokens": [dict(a) for a in tokenizer.get("added_tokens") or []]}


def place_mask_token(tokenizer: dict, mask_id: int) -> dict:
    """Return tokenizer.json content with `<|mask|>` as a special added token at `mask_id`."""
    return place_mask(tokenizer, mask_id).tokenizer


def place_mask(tokenizer: dict, mask_id: int) -> MaskPlacement:
    """`place_mask_token` with what it replaced. Raises ValueError when `<|mask|>` is already at
    another id, when `mask_id` is past the next free id, or when the result does not load as planned."""
    tokenizer = _copy_for_edit(tokenizer)
    added = tokenizer["added_tokens"]
    before = {a["content"]: a["id"] for a in added if a["content"] != MASK_TOKEN}
    elsewhere = [a["id"] for a in added if a["content"] == MASK_TOKEN and a["id"] != mask_id]
    if elsewhere:
        raise ValueError(f"the tokenizer already has {MASK_TOKEN} at id {elsewhere[0]}, not {mask_id}")
    vocab = model_vocab_ids(tokenizer["model"])
    free = max([*vocab, *(a["id"] for a in added), -1]) + 1
    if mask_id > free or (mask_id == free and mask_id < 0):
        raise ValueError(f"mask_token_id={mask_id} is past the tokenizer's next free id {free}; the "
                         f"tokenizer cannot hold a token there (choose an id <= {free})")
    replaced, dropped = ordinary_token_at(tokenizer, mask_id), []
    if mask_id in vocab and vocab[mask_id] != MASK_TOKEN:
        dropped = _rename_vocab_entry(tokenizer["model"], mask_id, vocab[mask_id])
    at_id = [a for a in added if a["id"] == mask_id]
    if at_id:
        before.pop(at_id[0]["content"], None)
        at_id[0].update(content=MASK_TOKEN, **ADDED_FLAGS)
    else:
        added.append({"id": mask_id, "content": MASK_TOKEN, **ADDED_FLAGS})
    added.sort(key=lambda a: a["id"])
    _verify(tokenizer, mask_id, before)
    return MaskPlacement(tokenizer, replaced, dropped)


def _verify(tokenizer: dict, mask_id: int, before: dict[str, int]) -> None:
    loaded = Tokenizer.from_str(json.dumps(tokenizer))
    got = loaded.token_to_id(MASK_TOKEN)
    moved = {t: (i, loaded.token_to_id(t)) for t, i in before.items() if loaded.token_to_id(t) != i}
    if got != mask_id or moved:
        raise ValueError(f"placing {MASK_TOKEN} at id {mask_id} failed: it loads as id {got}; "
                         f"moved added tokens {moved}")
