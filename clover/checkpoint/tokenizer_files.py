"""Tokenizer files of a converted checkpoint: copied from the source, with `<|mask|>` registered as
a special token at the mask id (SPEC §10).

`tokenizers` gives a new added token the next free id, whatever id the JSON says, so the mask token
is placed by renaming the token already at that id (an added token, or a plain vocabulary entry the
BPE merges do not use) or by appending it when the id is the next free one. The result is reloaded
and checked: the mask id and every other added token's id must come out as intended.
"""

import json
import shutil
from pathlib import Path

from tokenizers import Tokenizer

MASK_TOKEN = "<|mask|>"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json")
_ADDED_FLAGS = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}


def _model_vocab_ids(model: dict) -> dict[int, str]:
    """id -> token of the tokenizer model's own vocabulary (dict vocab, or Unigram's list)."""
    vocab = model.get("vocab") or {}
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        return {i: piece for i, (piece, _) in enumerate(vocab)}
    return {i: token for token, i in vocab.items()}


def _in_merges(model: dict, token: str) -> bool:
    for merge in model.get("merges") or []:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        if token in (left, right, left + right):
            return True
    return False


def next_free_id(src: str | Path) -> int | None:
    """The id `tokenizers` gives a new token (one past the largest), or None without tokenizer.json."""
    path = Path(src) / "tokenizer.json"
    if not path.is_file():
        return None
    return max(Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True).values()) + 1


def token_id(src: str | Path, token: str) -> int | None:
    path = Path(src) / "tokenizer.json"
    return Tokenizer.from_file(str(path)).token_to_id(token) if path.is_file() else None


def _rename_vocab_entry(model: dict, mask_id: int, old: str) -> None:
    if model.get("type") == "BPE" and _in_merges(model, old):
        raise ValueError(f"mask_token_id={mask_id} is the BPE token {old!r}, which the merges use; "
                         "choose an unused id or omit --mask-token-id to append one")
    if isinstance(model["vocab"], list):
        model["vocab"][mask_id][0] = MASK_TOKEN
    else:
        del model["vocab"][old]
        model["vocab"][MASK_TOKEN] = mask_id


def place_mask_token(tokenizer: dict, mask_id: int) -> dict:
    """Return tokenizer.json content with `<|mask|>` as a special added token at `mask_id`."""
    tokenizer = json.loads(json.dumps(tokenizer))
    added = tokenizer.setdefault("added_tokens", [])
    before = {a["content"]: a["id"] for a in added if a["content"] != MASK_TOKEN}
    elsewhere = [a["id"] for a in added if a["content"] == MASK_TOKEN and a["id"] != mask_id]
    if elsewhere:
        raise ValueError(f"the tokenizer already has {MASK_TOKEN} at id {elsewhere[0]}, not {mask_id}")
    vocab = _model_vocab_ids(tokenizer["model"])
    free = max([*vocab, *(a["id"] for a in added), -1]) + 1
    at_id = [a for a in added if a["id"] == mask_id]
    if at_id:
        before.pop(at_id[0]["content"], None)
        at_id[0].update(content=MASK_TOKEN, **_ADDED_FLAGS)
    elif mask_id in vocab:
        _rename_vocab_entry(tokenizer["model"], mask_id, vocab[mask_id])
        added.append({"id": mask_id, "content": MASK_TOKEN, **_ADDED_FLAGS})
    elif mask_id == free:
        added.append({"id": mask_id, "content": MASK_TOKEN, **_ADDED_FLAGS})
    else:
        raise ValueError(f"mask_token_id={mask_id} is past the tokenizer's next free id {free}; the "
                         f"tokenizer cannot hold a token there (choose an id <= {free})")
    added.sort(key=lambda a: a["id"])
    _verify(tokenizer, mask_id, before)
    return tokenizer


def _verify(tokenizer: dict, mask_id: int, before: dict[str, int]) -> None:
    loaded = Tokenizer.from_str(json.dumps(tokenizer))
    got = loaded.token_to_id(MASK_TOKEN)
    moved = {t: (i, loaded.token_to_id(t)) for t, i in before.items() if loaded.token_to_id(t) != i}
    if got != mask_id or moved:
        raise ValueError(f"placing {MASK_TOKEN} at id {mask_id} failed: it loads as id {got}; "
                         f"moved added tokens {moved}")


def _update_tokenizer_config(config: dict, mask_id: int) -> dict:
    decoder = {k: v for k, v in config.get("added_tokens_decoder", {}).items()
               if v.get("content") != MASK_TOKEN or int(k) == mask_id}
    decoder[str(mask_id)] = {"content": MASK_TOKEN, **_ADDED_FLAGS}
    config["added_tokens_decoder"] = dict(sorted(decoder.items(), key=lambda kv: int(kv[0])))
    config["mask_token"] = MASK_TOKEN
    return config


def _rewrite_json(path: Path, edit) -> None:
    path.write_text(json.dumps(edit(json.loads(path.read_text())), indent=2, ensure_ascii=False) + "\n")


def copy_tokenizer(src: str | Path, dst: str | Path, mask_id: int) -> list[str]:
    """Copy the tokenizer files of `src` into `dst` with `<|mask|>` at `mask_id`; return their names."""
    src, dst = Path(src), Path(dst)
    copied = [name for name in TOKENIZER_FILES if (src / name).is_file()]
    for name in copied:
        shutil.copy2(src / name, dst / name)
    if "tokenizer.json" in copied:
        _rewrite_json(dst / "tokenizer.json", lambda t: place_mask_token(t, mask_id))
    if "tokenizer_config.json" in copied:
        _rewrite_json(dst / "tokenizer_config.json", lambda c: _update_tokenizer_config(c, mask_id))
    if "special_tokens_map.json" in copied:
        _rewrite_json(dst / "special_tokens_map.json", lambda m: {**m, "mask_token": MASK_TOKEN})
    return copied
