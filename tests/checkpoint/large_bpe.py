"""A large byte-level BPE tokenizer in the Qwen3.5 style, built from its merges in about a second.

Ranked tokens (ids in merge order, as in Qwen's vocabulary), then the special tokens:
  256 byte symbols; UTF-8 lead+continuation byte pairs; every kana, CJK punctuation and CJK
  ideograph (3-byte characters); printable-ASCII pairs; space + kana; space + kana + kana (this is
  where `' それ'` is formed: ('Ġそ', 'れ')); kana pairs; pairs of 256 CJK ideographs; a few
  three-character words built on earlier tokens, among them `' それは'` = (' それ', 'は'), a merge that
  uses `' それ'`. About 113k ranked tokens. Pre-tokenizer, normaliser and decoder are Qwen2's.
"""

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
MASKED_TEXT = " それ"  # the ordinary token that will sit at the mask id
CHINESE = "我们今天去公园散步天气很好这是一个测试中文分词的句子人工智能模型语言"
WORDS = [" それは", "それは", " これは", " あれは", " 私は", " 日本語", "今日は"]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what ByteLevel uses)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


BYTE = _bytes_to_unicode()


def byte_level(text: str) -> str:
    return "".join(BYTE[b] for b in text.encode())


def _three_byte_chars() -> list[str]:
    ranges = [(0x3000, 0x3040), (0x3040, 0x3100), (0x4E00, 0xA000)]  # CJK punctuation, kana, ideographs
    return [chr(c) for lo, hi in ranges for c in range(lo, hi)]


def _merges() -> list[tuple[str, str]]:
    merges: list[tuple[str, str]] = []
    leads = [*range(0xC2, 0xE0), *range(0xE0, 0xF0), *range(0xF0, 0xF5)]
    merges += [(BYTE[lead], BYTE[cont]) for lead in leads for cont in range(0x80, 0xC0)]
    for ch in _three_byte_chars():
        b = ch.encode()
        merges.append((BYTE[b[0]] + BYTE[b[1]], BYTE[b[2]]))
    ascii_chars = [BYTE[b] for b in range(0x20, 0x7F)]
    merges += [(a, b) for a in ascii_chars for b in ascii_chars]
    hiragana = [chr(c) for c in range(0x3041, 0x3097)]
    space = BYTE[0x20]
    merges += [(space, byte_level(k)) for k in hiragana]
    merges += [(space + byte_level(a), byte_level(b)) for a in hiragana for b in hiragana]
    merges += [(byte_level(a), byte_level(b)) for a in hiragana for b in hiragana]
    cjk = list(dict.fromkeys(CHINESE + "私日本語今".replace(" ", "")))
    cjk += [chr(c) for c in range(0x4E00, 0xA000) if chr(c) not in cjk][: 256 - len(cjk)]
    merges += [(byte_level(a), byte_level(b)) for a in cjk for b in cjk]
    for word in WORDS:  # (first two characters, third)
        merges.append((byte_level(word[:-1]), byte_level(word[-1])))
    return list(dict.fromkeys(merges))


def build_large_bpe() -> Tokenizer:
    vocab = {BYTE[b]: i for i, b in enumerate(sorted(BYTE))}
    merges = []
    for left, right in _merges():
        if left in vocab and right in vocab and left + right not in vocab:
            vocab[left + right] = len(vocab)
            merges.append((left, right))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    return tok


def save_large_bpe(tok: Tokenizer, path: Path) -> Path:
    """tokenizer.json plus a Qwen-style tokenizer_config.json (Qwen2Tokenizer class, specials listed)."""
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    first = tok.token_to_id(SPECIALS[0])
    decoder = {str(first + i): {"content": s, "special": True} for i, s in enumerate(SPECIALS)}
    config = {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "unk_token": None, "added_tokens_decoder": decoder, "chat_template": "{{ messages }}"}
    (path / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    return path
