"""`CloverMoeConfig` validation: every bad value raises `ValueError` naming the field."""

import pytest

from clover.model import CloverMoeConfig
from tiny import TINY, tiny_config


def test_defaults_are_the_preview_checkpoint():
    c = CloverMoeConfig()
    assert (c.num_hidden_layers, c.hidden_size, c.num_experts, c.num_experts_per_tok) == (40, 2048, 256, 8)
    assert c.layer_types.count("full_attention") == 10 and c.layer_types[3] == "full_attention"
    assert (c.mask_token_id, c.block_size, c.moe_block_coreset_top_p) == (151669, 32, 0.9)
    assert c.denoising_config == {"algorithm": "low_confidence", "threshold": 0.95}
    assert c.rope_parameters["rope_theta"] == 10_000_000.0
    assert c.rope_parameters["partial_rotary_factor"] == 0.25


@pytest.mark.parametrize("field, overrides", [
    ("layer_types", dict(layer_types=["linear_attention"] * 3)),
    ("layer_types", dict(layer_types=["linear_attention"] * 3 + ["sliding_attention"])),
    ("num_key_value_heads", dict(num_key_value_heads=3)),
    ("linear_num_key_heads", dict(linear_num_key_heads=3)),
    ("block_size", dict(block_size=3)),
    ("block_size", dict(block_size=64)),
    ("block_size", dict(block_size=0)),
    ("mask_token_id", dict(mask_token_id=TINY["vocab_size"])),
    ("mask_token_id", dict(mask_token_id=-1)),
    ("num_experts_per_tok", dict(num_experts_per_tok=9)),
    ("moe_block_coreset_top_p", dict(moe_block_coreset_top_p=0.0)),
    ("moe_block_coreset_top_p", dict(moe_block_coreset_top_p=1.5)),
    ("attention_pattern", dict(attention_pattern="causal")),
    ("denoising_config.threshold", dict(denoising_config={"algorithm": "low_confidence", "threshold": 0})),
    ("hidden_size", dict(hidden_size=0)),
    # wrong types: the strict dataclass's own error, re-raised as a ValueError
    ("block_size", dict(block_size=2.0)),
    ("mask_token_id", dict(mask_token_id="127")),
    ("layer_types", dict(layer_types="linear_attention")),
])
def test_bad_config_raises_value_error_naming_the_field(field, overrides):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        tiny_config(**overrides)


@pytest.mark.parametrize("block_size", [1, 2, 4, 8, 16, 32])
def test_every_divisor_of_32_is_a_valid_block_size(block_size):
    assert tiny_config(block_size=block_size).block_size == block_size


def test_round_trips_through_json(tmp_path):
    c = tiny_config(block_size=8, moe_block_coreset_top_p=1)
    c.save_pretrained(tmp_path)
    loaded = CloverMoeConfig.from_pretrained(tmp_path)
    assert loaded.to_dict() == c.to_dict()
