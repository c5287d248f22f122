"""Train, save and load the small byte-level BPE tokenizer that Clover models ship.

Contract:
  * ``SPECIAL_TOKENS`` take ids ``0 .. len(SPECIAL_TOKENS) - 1`` in list order, each
    encodes to exactly one id wherever it appears in text, and is never split.
  * Byte-level: every UTF-8 string round-trips exactly,
    ``tok.decode(tok.encode(x)) == x`` (no prefix space, no clean-up of spaces).
  * Digits are always single tokens and letters never merge with digits or symbols, which
    makes numbers and names easy for a tiny model to copy and compare. With the default
    spacing ("own") a word never merges with a space either, so it has one token sequence
    wherever it appears; the other spacings attach one space to a word (``SPACINGS``).
  * ``save_tokenizer`` writes a folder that ``transformers.AutoTokenizer.from_pretrained``
    loads offline, chat template included.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from clover.data.chat_template import CHAT_TEMPLATE

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MASK = "<|mask|>"

SPECIAL_TOKENS: list[str] = [
    ENDOFTEXT,
    IM_START,
    IM_END,
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    MASK,
]
# Added tokens that are text a reader should see (as in Qwen3's tokenizers): kept whole like the
# special tokens, but not special, so `decode(..., skip_special_tokens=True)` keeps the think block
# and tool-call tags that separate reasoning and calls from the answer.
TEXT_MARKERS: tuple[str, ...] = ("<think>", "</think>", "<tool_call>", "</tool_call>")

# Pieces the BPE may merge inside (never across), by how a word and the space next to it are
# tokenized (`SPACINGS`). Every pattern splits off an English contraction, one digit, a run of
# punctuation with trailing newlines, newline runs and other whitespace; they differ in where a
# space goes:
#   "own" (the shipped tokenizer): letters alone, never with a space or symbol, so a word is the same
#     token wherever it appears (after a space, a quote, "=" or a line start) and copying a name is an
#     identity copy, but every space between words is a token of its own: a lookup spans twice the
#     tokens, and the next word is predicted from a space;
#   "trailing": a word or punctuation run carries the one space after it ("Is Kim rested? Kim is" is
#     `Is `, `Kim `, `rested`, `? `, `Kim `, `is `), so text has fewer tokens (joint's examples a
#     third fewer) and a name, nearly always followed by a space, keeps one token; a word before
#     punctuation is another token than the same word before a space;
#   "leading": a word or punctuation run carries the one space before it, as GPT-2's and Qwen's
#     tokenizers do, so a word at a line start is another token than the same word after a space.
# (in "own" and "leading" a punctuation run takes the space before it, as the shipped tokenizer does)
_PIECES = {  # spacing: (letters, punctuation)
    "own": (r"\p{L}+", r" ?[^\s\p{L}\p{N}]+"),
    "trailing": (r"\p{L}+ ?", r"[^\s\p{L}\p{N}]+ ?"),
    "leading": (r" ?\p{L}+", r" ?[^\s\p{L}\p{N}]+"),
}
SPACINGS = tuple(_PIECES)


def split_pattern(spacing: str = "own") -> str:
    """The pre-tokenizer's regex for `spacing` (one of `SPACINGS`)."""
    if spacing not in _PIECES:
        raise ValueError(f"tokenizer spacing={spacing!r} is unknown; known: {list(SPACINGS)}")
    letters, punctuation = _PIECES[spacing]
    return (r"'(?:[sdmt]|ll|ve|re)"
            rf"|{letters}"
            r"|\p{N}"
            rf"|{punctuation}[\r\n]*"
            r"|\s*[\r\n]+"
            r"|\s+(?!\S)"
            r"|\s+")


def _build_backend(spacing: str) -> Tokenizer:
    """An untrained BPE whose pre-tokenizer and decoder make it lossless on bytes."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split_pattern(spacing)), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def wrap_backend(backend: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap a trained ``tokenizers.Tokenizer`` with Clover's special-token roles and template."""
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        mask_token=MASK,
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def train_tokenizer(texts: Iterable[str], vocab_size: int, spacing: str = "own") -> PreTrainedTokenizerFast:
    """Train a byte-level BPE of at most ``vocab_size`` entries on ``texts``, splitting words
    from spaces as ``spacing`` says (`SPACINGS`).

    The vocabulary always holds the special tokens (first ids) and all 256 byte symbols,
    so ``vocab_size`` must exceed ``len(SPECIAL_TOKENS) + 256``. Training consumes the
    iterable once; it is deterministic for a given sequence of texts.
    """
    floor = len(SPECIAL_TOKENS) + 256
    if vocab_size <= floor:
        raise ValueError(f"vocab_size must be > {floor}, got {vocab_size}")
    backend = _build_backend(spacing)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_strip_specials(texts), trainer=trainer)
    for i, token in enumerate(SPECIAL_TOKENS):
        assert backend.token_to_id(token) == i, f"{token} did not get id {i}"
    return wrap_backend(unmark_text_markers(backend))


def unmark_text_markers(backend: Tokenizer) -> Tokenizer:
    """The same tokenizer with `TEXT_MARKERS` as non-special added tokens (the BPE trainer adds
    every token it is given as special)."""
    data = json.loads(backend.to_str())
    for added in data["added_tokens"]:
        if added["content"] in TEXT_MARKERS:
            added["special"] = False
    return Tokenizer.from_str(json.dumps(data))


def _strip_specials(texts: Iterable[str]) -> Iterator[str]:
    """Drop special-token strings so merges are learned on ordinary text only."""
    for text in texts:
        for token in SPECIAL_TOKENS:
            text = text.replace(token, "\n")
        yield text


def save_tokenizer(tok: PreTrainedTokenizerFast, directory: str | Path) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (plus whatever transformers
    adds, e.g. the chat template file) into ``directory``; return its path."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(path))
    _pin_config(path / "tokenizer_config.json")
    return path


def _pin_config(config_path: Path) -> None:
    """Make the config self-describing so AutoTokenizer needs no ``config.json``."""
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config.setdefault("chat_template", CHAT_TEMPLATE)
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def load_tokenizer(directory: str | Path) -> PreTrainedTokenizerFast:
    """Load a folder written by ``save_tokenizer`` (offline, via AutoTokenizer)."""
    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
