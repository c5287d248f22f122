"""`clover.info` and `clover info`: counts from a meta-device model."""

import json
import resource

import pytest

from clover.cli.main import main
from clover.info import config_from_dir, count, layer_pattern, meta_model, model_info, preset_config
from tiny import tiny_config, tiny_model


@pytest.fixture(scope="module")
def preset_info():
    return model_info(preset_config("clover-35b-a3b"))


def test_preset_is_35b_total_3b_active(preset_info):
    assert 34.0e9 < preset_info.total_params < 36.0e9
    assert 2.7e9 < preset_info.active_params < 3.3e9
    assert 68e9 < preset_info.bytes_bf16 < 71e9  # "about 69 GB" (SPEC §1)
    assert 0.25 < preset_info.bytes_int4 / preset_info.bytes_bf16 < 0.30
    assert preset_info.layer_pattern == "(3×linear_attention, full_attention)×10"
    assert (preset_info.block_size, preset_info.coreset_top_p) == (32, 0.9)


def test_meta_model_allocates_nothing():
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    model = meta_model(preset_config("clover-35b-a3b"))
    assert all(p.is_meta for p in model.parameters())
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    assert grown_mib < 500  # vs 69 GB of bf16 weights


def test_counts_match_a_real_tiny_model_by_hand():
    config = tiny_config()
    model = tiny_model()
    stats = count(model, config.num_experts_per_tok)
    assert stats == count(meta_model(config), config.num_experts_per_tok)
    total = sum(p.numel() for p in model.parameters())
    experts = sum(layer.mlp.experts.gate_up_proj.numel() + layer.mlp.experts.down_proj.numel()
                  for layer in model.model.layers)
    embedding = model.model.embed_tokens.weight
    expected_active = (total - experts - embedding.numel() + embedding.shape[1]
                       + experts * config.num_experts_per_tok // config.num_experts)
    assert stats["total_params"] == total and stats["active_params"] == expected_active
    assert stats["bytes_bf16"] == 2 * total


def test_tied_embeddings_are_counted_once():
    config = tiny_config(tie_word_embeddings=True)
    untied = count(meta_model(tiny_config()), 2)
    tied = count(meta_model(config), 2)
    assert untied["total_params"] - tied["total_params"] == config.vocab_size * config.hidden_size
    assert tied["active_params"] == untied["active_params"]


def test_quantized_bytes_are_clover_quantizes_format():
    """int8/int4 bytes are what `clover quantize` writes (counted the same way), between a quarter
    and a half of bf16 for int4 and under bf16 for int8."""
    from clover.quantization import quantized_bytes

    config = tiny_config()
    info = model_info(config, group_size=16)
    assert (info.bytes_int8, info.bytes_int4) == (quantized_bytes(config, 8, 16), quantized_bytes(config, 4, 16))
    assert info.bytes_int4 < info.bytes_int8 < info.bytes_bf16
    assert model_info(config, group_size=128).bytes_int4 is None  # 128 does not divide the tiny widths


def test_cli_bits_says_what_fits(capsys):
    """The issue's question: does Clover-35B-A3B at int4 fit a 16 GB or a 24 GB GPU (weights only)."""
    assert main(["info", "--preset", "clover-35b-a3b", "--bits", "4"]) == 0
    out = capsys.readouterr().out
    weights = [line for line in out.splitlines() if "GB" in line and "int4" in line]
    assert len(weights) == 1 and "exceeds 16 GB / fits 24 GB" in weights[0]
    assert "bf16" not in weights[0]


@pytest.mark.parametrize("types, expected", [
    (["linear_attention"] * 3 + ["full_attention"], "3×linear_attention, full_attention"),
    ((["linear_attention"] * 3 + ["full_attention"]) * 2, "(3×linear_attention, full_attention)×2"),
    (["full_attention"] * 4, "full_attention×4"),
    (["linear_attention", "full_attention", "full_attention"], "linear_attention, 2×full_attention"),
])
def test_layer_pattern(types, expected):
    assert layer_pattern(types) == expected


def test_cli_reads_only_config_json(tmp_path, capsys):
    tiny_config(block_size=8).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not read")
    assert main(["info", "--model", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["block_size"] == 8 and out["num_layers"] == 4
    assert out["total_params"] == count(meta_model(tiny_config()), 2)["total_params"]


def test_backbone_text_config_is_accepted(tmp_path):
    text = {k: v for k, v in tiny_config().to_dict().items() if k != "model_type"}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe", "text_config": text}))
    assert config_from_dir(tmp_path).num_hidden_layers == 4


def test_cli_default_is_the_preset(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "34.66B total" in out and "(3×linear_attention, full_attention)×10" in out


def test_cli_missing_dir_is_an_error(tmp_path, capsys):
    assert main(["info", "--model", str(tmp_path / "nope")]) == 2
    assert "config.json" in capsys.readouterr().err
