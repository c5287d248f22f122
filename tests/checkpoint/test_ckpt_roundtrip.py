"""save_pretrained -> from_pretrained is exact: identical state dict and bit-equal logits (causal and
block mode, randomised block parameters) for one file, shards and per-expert experts."""

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

import clover  # noqa: F401
from ckpt_helpers import logits
from clover.model import CloverMoeForCausalLM
from tiny import tiny_model

IDS = torch.randint(0, 120, (2, 12), generator=torch.Generator().manual_seed(1))
LAYOUTS = {
    "single": dict(),
    "sharded": dict(max_shard_size="40KB"),
    "per-expert-sharded": dict(experts="per_expert", max_shard_size=30_000),
}


def randomise_block_params(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("logit_scale", "history_bias", "history_c")):
                p.copy_(torch.rand(()) + 0.5)
    return model


def assert_identical(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    assert torch.equal(logits(a, IDS), logits(b, IDS))
    assert torch.equal(logits(a, IDS, block_len=4), logits(b, IDS, block_len=4))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_round_trip_is_exact(tmp_path, layout):
    model = randomise_block_params(tiny_model(seed=2))
    model.save_pretrained(tmp_path / "ck", **LAYOUTS[layout])
    files = {p.name for p in (tmp_path / "ck").iterdir()}
    assert {"config.json", "generation_config.json", "bd_gdn_conv_right_weight.safetensors",
            "bd_gdn_softmax_scalars.safetensors", "modeling_clover_moe.py", "checkpoint_io.py"} <= files
    assert ("model.safetensors.index.json" in files) == (layout != "single")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ck")
    assert isinstance(loaded, CloverMoeForCausalLM) and not loaded.training
    assert_identical(model, loaded)


def test_layout_of_saved_files(tmp_path):
    model = tiny_model(seed=3)
    model.save_pretrained(tmp_path / "ck", experts="per_expert")
    with safe_open(tmp_path / "ck" / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        gate = f.get_tensor("model.layers.0.mlp.experts.3.gate_proj.weight")
        up = f.get_tensor("model.layers.0.mlp.experts.3.up_proj.weight")
    assert "model.layers.0.mlp.experts.gate_up_proj" not in keys
    assert not any("conv_right_weight" in k or "history_c" in k for k in keys)
    fused = model.model.layers[0].mlp.experts.gate_up_proj[3]
    assert torch.equal(torch.cat((gate, up)), fused)  # gate_up = cat(gate, up) on dim 0
    with safe_open(tmp_path / "ck" / "bd_gdn_softmax_scalars.safetensors", "pt") as f:
        assert f.get_tensor("model.layers.0.linear_attn.logit_scale").shape == ()
    with safe_open(tmp_path / "ck" / "bd_gdn_conv_right_weight.safetensors", "pt") as f:
        assert f.get_tensor("model.layers.2.linear_attn.conv_right_weight").shape == (64, 4)
        assert "model.layers.3.linear_attn.conv_right_weight" not in f.keys()  # a full-attention layer
    config = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert config["architectures"] == ["CloverMoeForCausalLM"] and config["model_type"] == "clover_moe"
    assert config["auto_map"] == {"AutoConfig": "configuration_clover_moe.CloverMoeConfig",
                                  "AutoModelForCausalLM": "modeling_clover_moe.CloverMoeForCausalLM"}


def test_dtype_device_and_generation_config(tmp_path):
    model = tiny_model(seed=4)
    model.generation_config.threshold = 0.8
    model.save_pretrained(tmp_path / "ck")
    loaded = CloverMoeForCausalLM.from_pretrained(tmp_path / "ck", dtype=torch.bfloat16, device_map="cpu")
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    assert loaded.model.rotary_emb.inv_freq.dtype == torch.float32  # buffers keep their dtype
    assert loaded.generation_config.threshold == 0.8
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight.to(torch.bfloat16))
    auto = CloverMoeForCausalLM.from_pretrained(tmp_path / "ck", dtype="auto")
    assert auto.lm_head.weight.dtype == torch.float32


def test_tied_embeddings_round_trip(tmp_path):
    model = tiny_model(seed=5, tie_word_embeddings=True)
    model.save_pretrained(tmp_path / "ck")
    with safe_open(tmp_path / "ck" / "model.safetensors", "pt") as f:
        assert "lm_head.weight" not in f.keys()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ck")
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert_identical(model, loaded)


def test_saving_over_a_checkpoint_replaces_weights_and_keeps_tokenizer(tmp_path):
    tiny_model(seed=6).save_pretrained(tmp_path / "ck", max_shard_size="40KB")
    (tmp_path / "ck" / "tokenizer.json").write_text("{}")
    model = tiny_model(seed=7)
    model.save_pretrained(tmp_path / "ck")
    names = {p.name for p in (tmp_path / "ck").iterdir()}
    assert "tokenizer.json" in names and "model.safetensors" in names
    assert not any(n.startswith("model-") or n.endswith(".index.json") for n in names)
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]
    assert_identical(model, AutoModelForCausalLM.from_pretrained(tmp_path / "ck"))
