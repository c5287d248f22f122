"""C1 through conversion: transformers Qwen3.5-MoE -> `clover convert` -> AutoModelForCausalLM
reproduces the source logits (fp32, <= 1e-4), for several head layouts, rotary fractions and layer
patterns, the multimodal layout, a fused-expert source, and each way of choosing the mask id."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

import clover  # noqa: F401  (registers clover_moe with the Auto classes)
from ckpt_helpers import hf_model, logits, make_tokenizer, save_hf
from clover.checkpoint import ConvertOptions, convert_checkpoint
from clover.cli.main import main
from clover.model import CloverMoeForCausalLM

CONFIGS = {
    "gqa2-rot0.25-default-pattern": dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                          "partial_rotary_factor": 0.25}),
    "gqa6-rot0.5-alternating": dict(
        num_attention_heads=6, num_key_value_heads=1, head_dim=16, linear_num_key_heads=1,
        linear_num_value_heads=3, linear_key_head_dim=16, linear_value_head_dim=8, num_hidden_layers=4,
        layer_types=["full_attention", "linear_attention", "full_attention", "linear_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "partial_rotary_factor": 0.5}),
    "mha-rot1.0-three-layers-tied": dict(
        tie_word_embeddings=True, num_attention_heads=2, num_key_value_heads=2, head_dim=12,
        linear_num_key_heads=4, linear_num_value_heads=4, num_hidden_layers=3, num_experts=4,
        num_experts_per_tok=3,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 1.0}),
}
IDS = torch.randint(0, 120, (2, 13), generator=torch.Generator().manual_seed(0))  # never the mask id


def assert_c1(hf, clover_model, ids=IDS, skip_column=None):
    """Max abs logit diff <= 1e-4 over the source vocabulary (less `skip_column`, the mask token's
    own logit when its lm_head row was re-initialised)."""
    ref = logits(hf, ids)
    out = logits(clover_model, ids)[..., :ref.shape[-1]]
    keep = torch.arange(ref.shape[-1]) != skip_column
    assert (ref - out)[..., keep].abs().max() <= 1e-4


@pytest.mark.parametrize("name", list(CONFIGS))
def test_c1_after_conversion(tmp_path, name):
    hf = hf_model(seed=len(name), **CONFIGS[name])
    save_hf(hf, tmp_path / "hf")
    result = convert_checkpoint(tmp_path / "hf", tmp_path / "clover")
    assert result.mask_row == "appended" and result.config.mask_token_id == 128
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "clover")
    assert isinstance(model, CloverMoeForCausalLM) and model.config.vocab_size == 129
    assert_c1(hf, model)
    for layer in model.model.layers:  # block params start at their defaults
        if layer.kind == "linear_attention":
            assert not layer.linear_attn.conv_right_weight.any()
            assert layer.linear_attn.history_c.item() == 1.0


def test_cli_convert_sets_clover_fields(tmp_path, capsys):
    hf = hf_model(seed=3)
    save_hf(hf, tmp_path / "hf")
    code = main(["convert", str(tmp_path / "hf"), str(tmp_path / "out"), "--block-size", "16",
                 "--no-coreset", "--coreset-top-p", "0.8", "--max-shard-size", "20KB"])
    captured = capsys.readouterr()
    assert code == 0 and "appended" in captured.out
    assert "Converting hf" in captured.err and "100%" in captured.err  # the progress bar, on stderr
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["block_size"] == 16 and config["mask_token_id"] == 128
    assert config["moe_block_coreset_enabled"] is False and config["moe_block_coreset_top_p"] == 0.8
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_clover_moe.CloverMoeForCausalLM"
    generation = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert generation["block_size"] == 16 and "top_k" not in generation  # neutral 0: left out
    assert generation["max_new_tokens"] == 24576 and generation["presence_penalty"] == 0.9
    assert generation["eos_token_id"] == [125, 127] and generation["pad_token_id"] == 127
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file()
    assert_c1(hf, AutoModelForCausalLM.from_pretrained(tmp_path / "out"))


def test_cli_reports_bad_source(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "out")]) == 2
    assert "config.json" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_multimodal_layout_is_converted(tmp_path):
    hf = hf_model(seed=4)
    save_hf(hf, tmp_path / "hf")
    text = json.loads((tmp_path / "hf" / "config.json").read_text())
    eos = text.pop("eos_token_id")
    top = {"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
           "text_config": text, "vision_config": {"depth": 1}, "eos_token_id": eos, "image_token_id": 3}
    src = tmp_path / "mm"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(top))
    tensors = {("model.language_model." + k.removeprefix("model.") if k.startswith("model.") else k): v
               for k, v in load_file(tmp_path / "hf" / "model.safetensors").items()}
    tensors["mtp.0.foo"] = torch.zeros(3)
    tensors["model.visual.blocks.0.weight"] = torch.zeros(2, 2)
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"a.safetensors": names[:half], "b.safetensors": names[half:]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, src / shard)
    weight_map = {k: shard for shard, keys in shards.items() for k in keys}
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    result = convert_checkpoint(src, tmp_path / "clover")
    assert result.config.eos_token_id == eos
    stored = load_file(tmp_path / "clover" / "model.safetensors")
    assert not any(k.startswith(("mtp.", "model.visual", "model.language_model")) for k in stored)
    assert_c1(hf, AutoModelForCausalLM.from_pretrained(tmp_path / "clover"))


def test_fused_expert_source_and_bf16_output(tmp_path):
    hf = hf_model(seed=5)
    src = tmp_path / "fused"
    src.mkdir()
    save_file(hf.state_dict(), src / "model.safetensors")  # in-memory names: fused experts
    hf.config.save_pretrained(src)
    convert_checkpoint(src, tmp_path / "fp32")
    assert "model.layers.0.mlp.experts.gate_up_proj" in load_file(tmp_path / "fp32" / "model.safetensors")
    assert_c1(hf, AutoModelForCausalLM.from_pretrained(tmp_path / "fp32"))
    convert_checkpoint(src, tmp_path / "bf16", ConvertOptions(dtype="bf16"))
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16")
    assert model.lm_head.weight.dtype == torch.bfloat16 and model.config.dtype == torch.bfloat16


def test_mask_id_append_with_tokenizer(tmp_path):
    hf = hf_model(seed=6)
    save_hf(hf, tmp_path / "hf")
    make_tokenizer(tmp_path / "hf", num_tokens=128)
    result = convert_checkpoint(tmp_path / "hf", tmp_path / "out")
    assert result.mask_row == "appended" and result.config.mask_token_id == 128
    tok = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    assert tok.token_to_id("<|mask|>") == 128 and tok.token_to_id("<think>") == 126
    fast = PreTrainedTokenizerFast.from_pretrained(tmp_path / "out")
    assert fast.mask_token == "<|mask|>" and fast.mask_token_id == 128
    assert fast.convert_tokens_to_ids("<|im_end|>") == 125
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    embed = hf.model.embed_tokens.weight
    assert torch.allclose(model.model.embed_tokens.weight[128], embed.mean(0), atol=1e-6)
    assert torch.allclose(model.lm_head.weight[128], hf.lm_head.weight.mean(0), atol=1e-6)
    generation = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert generation["think_start_token_id"] == 126 and generation["think_end_token_id"] == 127
    assert_c1(hf, model)


def test_mask_id_reuse_renames_token(tmp_path):
    hf = hf_model(seed=7)
    save_hf(hf, tmp_path / "hf")
    make_tokenizer(tmp_path / "hf", num_tokens=128)
    result = convert_checkpoint(tmp_path / "hf", tmp_path / "out", ConvertOptions(mask_token_id=5))
    assert result.mask_row == "reused" and result.config.vocab_size == 128
    tok = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    assert tok.token_to_id("<|mask|>") == 5 and tok.token_to_id("w5") is None
    assert tok.token_to_id("<|im_end|>") == 125
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert torch.equal(model.model.embed_tokens.weight, hf.model.embed_tokens.weight)
    assert_c1(hf, model, IDS.clamp(min=6))


def test_mask_id_defaults_to_unused_padding_row(tmp_path):
    hf = hf_model(seed=8)
    save_hf(hf, tmp_path / "hf")
    make_tokenizer(tmp_path / "hf", num_tokens=120)  # embedding rows 120..127 are padding
    result = convert_checkpoint(tmp_path / "hf", tmp_path / "out")
    assert result.mask_row == "unused_row" and result.config.mask_token_id == 120
    assert result.config.vocab_size == 128
    assert Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json")).token_to_id("<|mask|>") == 120
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    embed = hf.model.embed_tokens.weight
    assert torch.allclose(model.model.embed_tokens.weight[120], embed[:120].mean(0), atol=1e-6)
    assert_c1(hf, model, IDS % 110, skip_column=120)


def test_mask_id_outside_vocab_is_refused(tmp_path):
    save_hf(hf_model(seed=9), tmp_path / "hf")
    with pytest.raises(ValueError, match="mask_token_id=500"):
        convert_checkpoint(tmp_path / "hf", tmp_path / "out", ConvertOptions(mask_token_id=500))
    assert not (tmp_path / "out").exists()


def test_reconverting_a_clover_checkpoint_keeps_its_mask(tmp_path):
    hf = hf_model(seed=10)
    save_hf(hf, tmp_path / "hf")
    make_tokenizer(tmp_path / "hf", num_tokens=128)
    convert_checkpoint(tmp_path / "hf", tmp_path / "once")
    result = convert_checkpoint(tmp_path / "once", tmp_path / "twice", ConvertOptions(block_size=8))
    assert result.mask_row == "reused" and result.config.mask_token_id == 128
    assert result.config.vocab_size == 129 and result.config.block_size == 8
    assert Tokenizer.from_file(str(tmp_path / "twice" / "tokenizer.json")).token_to_id("<|mask|>") == 128
    assert_c1(hf, AutoModelForCausalLM.from_pretrained(tmp_path / "twice"))
