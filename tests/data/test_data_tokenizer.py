"""Byte-level BPE: exact round trips, special tokens as single fixed ids, save/load."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from clover.data.corpus import tokenizer_corpus, training_examples
from clover.data.tokenizer import SPECIAL_TOKENS, load_tokenizer, save_tokenizer, train_tokenizer

SAMPLES = [
    "",
    "hello world",
    "  two leading spaces and trailing  ",
    "line one\nline two\r\n\n\ttabbed\n",
    '[{"id":"Z13","location":"Old Town","radius_km":7.3,"start":"01:30","end":"02:45"}]',
    "1234567890 3.14159 -42 1e-9",
    "héllo wörld — 禁飞区 無人機 😀🚁",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nok<|im_end|>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call><|mask|><|mask|><|endoftext|>",
    "don't can't we'll I'd",
]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(tokenizer_corpus(training_examples(300, seed=1)), vocab_size=1000)


def test_special_tokens_take_first_ids(tok):
    assert SPECIAL_TOKENS[0] == "<|endoftext|>" and SPECIAL_TOKENS[-1] == "<|mask|>"
    assert tok.convert_tokens_to_ids(SPECIAL_TOKENS) == list(range(len(SPECIAL_TOKENS)))
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 0
    assert tok.mask_token == "<|mask|>" and tok.mask_token_id == 7


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text


@pytest.mark.parametrize("special", SPECIAL_TOKENS)
def test_special_token_is_one_id_in_context(tok, special):
    ids = tok.encode(f"a{special}b", add_special_tokens=False)
    assert ids.count(SPECIAL_TOKENS.index(special)) == 1
    assert tok.decode(ids) == f"a{special}b"


def test_digits_are_single_tokens(tok):
    pieces = tok.convert_ids_to_tokens(tok.encode("radius 12.75 km", add_special_tokens=False))
    assert [p for p in pieces if any(c.isdigit() for c in p)] == ["1", "2", "7", "5"]


def test_vocab_size_bounds(tok):
    assert 256 + len(SPECIAL_TOKENS) < len(tok) <= 1000
    with pytest.raises(ValueError):
        train_tokenizer(["x"], vocab_size=100)


def test_saved_dir_loads_with_auto_tokenizer(tok, tmp_path):
    save_tokenizer(tok, tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>"
    loaded = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    for text in SAMPLES:
        assert loaded.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
        assert loaded.decode(loaded.encode(text, add_special_tokens=False)) == text
    assert (loaded.eos_token, loaded.pad_token, loaded.mask_token) == ("<|im_end|>", "<|endoftext|>", "<|mask|>")
    msgs = [{"role": "user", "content": "hi"}]
    kwargs = dict(tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert loaded.apply_chat_template(msgs, **kwargs) == tok.apply_chat_template(msgs, **kwargs)
    assert len(load_tokenizer(tmp_path)) == len(tok)


def test_think_and_tool_call_tags_survive_skip_special_tokens():
    """As in Qwen3's tokenizers, the think and tool-call tags are whole added tokens but not special:
    a reader decoding with skip_special_tokens=True still sees where the reasoning ends. Checked on
    a freshly trained tokenizer and on the embedded model's."""
    import clover
    from clover.data import load_tokenizer
    from clover.data.tokenizer import TEXT_MARKERS, train_tokenizer

    for tok in (train_tokenizer(["a think b", "tool call c"] * 20, 300), load_tokenizer(clover.default_model_dir())):
        text = "<think>\nx\n</think>\n\n<tool_call>\ny\n</tool_call><|im_end|>"
        ids = tok(text, add_special_tokens=False).input_ids
        assert all(len(tok(m, add_special_tokens=False).input_ids) == 1 for m in TEXT_MARKERS)
        assert tok.decode(ids, skip_special_tokens=True) == text.replace("<|im_end|>", "")


@pytest.fixture(scope="module", params=["trailing", "leading"])
def spaced(request):
    corpus = list(tokenizer_corpus(training_examples(300, seed=1)))
    return request.param, train_tokenizer(corpus, vocab_size=1000, spacing=request.param)


@pytest.mark.parametrize("text", SAMPLES)
def test_spaced_round_trip(spaced, text):
    _, tok = spaced
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_spacing_attaches_one_space_to_a_word(spaced, tok):
    """`spacing` moves the space between two words into one of them; the shipped spacing ("own")
    gives every such space a token of its own. Digits stay single tokens in every spacing."""
    spacing, spaced_tok = spaced
    text = "Kim is rested. Is Kim cleared? radius 12.75 km"
    pieces = [spaced_tok.decode([i]) for i in spaced_tok.encode(text, add_special_tokens=False)]
    assert "".join(pieces) == text
    words = {"trailing": ["Kim ", "is ", "rested", ". "], "leading": ["Kim", " is", " rested", "."]}[spacing]
    assert pieces[:4] == words
    assert " " not in pieces[:3] and [p for p in pieces if any(c.isdigit() for c in p)] == ["1", "2", "7", "5"]
    own = [tok.decode([i]) for i in tok.encode(text, add_special_tokens=False)]
    assert own[:6] == ["Kim", " ", "is", " ", "rested", "."]


def test_unknown_spacing_is_refused():
    with pytest.raises(ValueError, match="spacing='tabs'.*'own', 'trailing', 'leading'"):
        train_tokenizer(["x y"] * 10, vocab_size=300, spacing="tabs")
