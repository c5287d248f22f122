"""Small pieces: mask-token placement in tokenizer.json, mask-id choice, shard sizes, devices, key names."""

import json

import pytest
import torch
from tokenizers import Tokenizer, models

from ckpt_helpers import SPECIALS, make_tokenizer
from clover.checkpoint.convert import choose_mask_id
from clover.checkpoint.mask_token import MASK_TOKEN, place_mask_token
from clover.model.checkpoint_io import resolve_device
from clover.model.checkpoint_names import expert_key, normalize_key
from clover.model.checkpoint_save import parse_size, plan_shards


@pytest.fixture
def tokenizer_json(tmp_path):
    make_tokenizer(tmp_path, num_tokens=40)  # words 0..33, [UNK] 34, specials 35..39
    return json.loads((tmp_path / "tokenizer.json").read_text())


def ids_after(content: dict) -> Tokenizer:
    return Tokenizer.from_str(json.dumps(content))


def test_place_mask_renames_an_added_token(tokenizer_json):
    tok = ids_after(place_mask_token(tokenizer_json, 36))  # was <|im_start|>
    assert tok.token_to_id(MASK_TOKEN) == 36 and tok.token_to_id("<|im_start|>") is None
    assert [tok.token_to_id(s) for s in SPECIALS if s != "<|im_start|>"] == [35, 37, 38, 39]


def test_place_mask_renames_a_vocab_token_or_appends(tokenizer_json):
    tok = ids_after(place_mask_token(tokenizer_json, 7))
    assert tok.token_to_id(MASK_TOKEN) == 7 and tok.encode("w6 <|mask|>").ids == [6, 7]
    assert tok.decode([7], skip_special_tokens=False) == MASK_TOKEN
    assert ids_after(place_mask_token(tokenizer_json, 40)).token_to_id(MASK_TOKEN) == 40


def test_place_mask_refuses_what_tokenizers_cannot_hold(tokenizer_json):
    with pytest.raises(ValueError, match="next free id 40"):
        place_mask_token(tokenizer_json, 45)
    already = place_mask_token(tokenizer_json, 40)
    with pytest.raises(ValueError, match="already has"):
        place_mask_token(already, 3)
    bpe = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2, "c": 3}, [("a", "b")]))
    merged = ids_after(place_mask_token(json.loads(bpe.to_str()), 2))  # a merged token: its merge goes
    assert merged.token_to_id(MASK_TOKEN) == 2 and merged.encode("ab").ids == [0, 1]
    assert ids_after(place_mask_token(json.loads(bpe.to_str()), 3)).token_to_id(MASK_TOKEN) == 3


def test_choose_mask_id():
    assert choose_mask_id(7, 100, 90) == (7, "reused")
    assert choose_mask_id(None, 100, 90) == (90, "unused_row")
    assert choose_mask_id(None, 100, 100) == (100, "appended")
    assert choose_mask_id(None, 100, None) == (100, "appended")
    with pytest.raises(ValueError, match="outside"):
        choose_mask_id(100, 100, None)


def test_sizes_shards_and_devices():
    assert parse_size("5GB") == 5 * 10**9 and parse_size("2GiB") == 2 * 2**30 and parse_size(123) == 123
    with pytest.raises(ValueError, match="max_shard_size"):
        parse_size("five gigs")
    assert plan_shards({"a": 6, "b": 5, "c": 20, "d": 1}, 10) == [["a"], ["b"], ["c"], ["d"]]
    assert plan_shards({"a": 3, "b": 3, "c": 3}, 10) == [["a", "b", "c"]]
    assert resolve_device(None) == torch.device("cpu") and resolve_device({"": "cpu"}) == torch.device("cpu")
    assert resolve_device(0) == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="single device"):
        resolve_device({"model": 0, "lm_head": "cpu"})


def test_key_names():
    assert normalize_key("model.language_model.layers.0.mlp.gate.weight") == "model.layers.0.mlp.gate.weight"
    assert normalize_key("mtp.layers.0.fc.weight") is None and normalize_key("model.visual.x") is None
    assert normalize_key("lm_head.weight") == "lm_head.weight"
    assert expert_key("model.layers.3.mlp.experts.gate_up_proj", 12, "up_proj") == (
        "model.layers.3.mlp.experts.12.up_proj.weight")
