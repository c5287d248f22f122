"""`<|mask|>` at a merged token of a large byte-level BPE (SPEC §10): conversion, and the in-memory fix
on load. The tokenizer (114k ranked tokens, Qwen2 pre-tokenizer) is built once per module."""

import json
import random

import pytest
from tokenizers import Tokenizer

from ckpt_helpers import hf_model, save_hf
from clover.checkpoint.mask_token import MASK_TOKEN, ordinary_token_at, place_mask
from clover.checkpoint.tokenizer_load import load_tokenizer
from clover.cli.main import main
from large_bpe import MASKED_TEXT, SPECIALS, build_large_bpe, byte_level, save_large_bpe

TEXTS = [
    MASKED_TEXT, " それは", "それは日本語です。 それ、 それは違う。 これは それ", "  それ  それそれ",
    "今日は良い天気ですね。私は日本語を勉強しています。",
    "我们今天去公园散步，天气很好。这是一个测试中文分词的句子。",
    "def f(x):\n    return x ** 2  # square\n\nclass A:\n    pass\n",
    "🙂👍🏽 家族👨‍👩‍👧 それ🙂 ✨",
    "3.14159 2025-01-01 1234567890 ¥1,000円 0x7fff 1e-6",
    "<|im_start|>user\n それ<|im_end|>",
]
POOL = list(" それはこれ、。") + list("我们天气好人工智能") + list("abc xyz_():=\n") + list("0123456789") + ["🙂", "👍🏽"]


def random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(POOL) for _ in range(rng.randint(1, 24))) for _ in range(n)]


@pytest.fixture(scope="module")
def bpe():
    tok = build_large_bpe()
    content = json.loads(tok.to_str())
    return tok, content, tok.token_to_id(byte_level(MASKED_TEXT))


@pytest.fixture(scope="module")
def placed(bpe):
    """(placement, the fixed tokenizer, ids of the tokens the dropped merges touch)."""
    tok, content, mask_id = bpe
    placement = place_mask(content, mask_id)
    return placement, Tokenizer.from_str(json.dumps(placement.tokenizer)), touched_ids(tok, placement.dropped_merges)


def touched_ids(tok: Tokenizer, dropped: list[tuple[str, str]]) -> set[int]:
    """Ids of the tokens the dropped merges produce (the old token among them) or use."""
    return {tok.token_to_id(t) for left, right in dropped for t in (left, right, left + right)}


def check_fixed(before: Tokenizer, after, mask_id: int, touched: set[int], texts: list[str]) -> int:
    """Every text round-trips and never yields the mask id; one whose old encoding formed no touched
    token encodes exactly as before. Returns how many texts were in that unchanged group."""
    unchanged = 0
    for text in texts:
        old = before.encode(text, add_special_tokens=False).ids
        new = after.encode(text, add_special_tokens=False)
        new = new if isinstance(new, list) else new.ids
        assert mask_id not in new, text
        assert after.decode(new, skip_special_tokens=False) == text, text
        if not touched & set(old):
            assert new == old, text
            unchanged += 1
    return unchanged


def test_large_bpe_mask_id_is_a_merged_token_used_by_later_merges(bpe):
    tok, content, mask_id = bpe
    assert tok.get_vocab_size(with_added_tokens=False) >= 100_000
    merges = [tuple(m) for m in content["model"]["merges"]]
    old = byte_level(MASKED_TEXT)
    assert any(left + right == old for left, right in merges)
    assert any(old in (left, right) for left, right in merges)
    assert tok.encode(MASKED_TEXT).ids == [mask_id] and ordinary_token_at(content, mask_id) == old


def test_place_mask_on_a_merged_bpe_token(bpe, placed):
    tok, content, mask_id = bpe
    placement, fixed, touched = placed
    assert placement.replaced == byte_level(MASKED_TEXT)
    assert (byte_level(" それ"), byte_level("は")) in placement.dropped_merges  # the merge that used it
    assert fixed.token_to_id(MASK_TOKEN) == mask_id and ordinary_token_at(placement.tokenizer, mask_id) is None
    assert fixed.encode(f"a{MASK_TOKEN}b").ids == [tok.token_to_id("a"), mask_id, tok.token_to_id("b")]
    assert [fixed.token_to_id(s) for s in SPECIALS] == [tok.token_to_id(s) for s in SPECIALS]
    unchanged = check_fixed(tok, fixed, mask_id, touched, TEXTS + random_texts(400))
    assert unchanged >= 200  # the comparison with the old encoding covered most texts
    assert len(fixed.encode(MASKED_TEXT).ids) == 2  # ' そ' + 'れ'


def test_place_mask_when_an_added_mask_shadows_a_vocab_token(bpe):
    """A tokenizer that registers <|mask|> at the id but keeps the merge still encodes ' それ' to it."""
    tok, content, mask_id = bpe
    shadowed = json.loads(json.dumps(content))
    shadowed["added_tokens"].append({"id": mask_id, "content": MASK_TOKEN, "single_word": False,
                                     "lstrip": False, "rstrip": False, "normalized": False, "special": True})
    assert Tokenizer.from_str(json.dumps(shadowed)).encode(MASKED_TEXT).ids == [mask_id]
    assert ordinary_token_at(shadowed, mask_id) == byte_level(MASKED_TEXT)
    fixed = Tokenizer.from_str(json.dumps(place_mask(shadowed, mask_id).tokenizer))
    assert mask_id not in fixed.encode(MASKED_TEXT).ids and fixed.token_to_id(MASK_TOKEN) == mask_id


@pytest.fixture(scope="module")
def converted(bpe, tmp_path_factory):
    """`clover convert SRC DST --mask-token-id <id of ' それ'>` on a Qwen3.5-MoE source with this tokenizer."""
    tok, _, mask_id = bpe
    root = tmp_path_factory.mktemp("mask_convert")
    eos = tok.token_to_id("<|im_end|>")
    vocab = (tok.get_vocab_size() + 63) // 64 * 64
    hf = hf_model(seed=3, vocab_size=vocab, hidden_size=16, eos_token_id=eos, pad_token_id=eos)
    save_hf(hf, root / "hf")
    save_large_bpe(tok, root / "hf")
    assert main(["convert", str(root / "hf"), str(root / "out"), "--mask-token-id", str(mask_id)]) == 0
    return root


def test_convert_places_mask_at_a_merged_token(bpe, placed, converted):
    tok, _, mask_id = bpe
    loaded = load_tokenizer(converted / "out")  # the Qwen2Tokenizer class, from the converted files
    assert type(loaded).__name__ == "Qwen2Tokenizer"
    assert loaded.mask_token == MASK_TOKEN and loaded.mask_token_id == mask_id
    assert loaded.convert_tokens_to_ids("<|im_end|>") == tok.token_to_id("<|im_end|>")
    check_fixed(tok, loaded, mask_id, placed[2], TEXTS + random_texts(100, seed=1))
    assert not (converted / "out" / "vocab.json").exists()


def test_loading_fixes_an_unconverted_tokenizer_once(bpe, placed, converted, monkeypatch):
    tok, _, mask_id = bpe
    import clover.checkpoint.tokenizer_load as tokenizer_load
    warnings = []
    monkeypatch.setattr(tokenizer_load.logger, "warning", warnings.append)
    load_tokenizer(converted / "out")
    assert warnings == []  # a converted checkpoint needs no fix
    stale = converted / "stale"
    stale.mkdir()
    (stale / "config.json").write_text((converted / "out" / "config.json").read_text())
    save_large_bpe(tok, stale)  # the source tokenizer: ' それ' still at the mask id
    loaded = load_tokenizer(stale)
    assert len(warnings) == 1 and repr(byte_level(MASKED_TEXT)) in warnings[0]
    assert loaded.mask_token_id == mask_id
    check_fixed(tok, loaded, mask_id, placed[2], TEXTS + random_texts(100, seed=2))
