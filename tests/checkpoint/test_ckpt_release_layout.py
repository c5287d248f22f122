"""The Hugging Face release layout (sharded, per-expert keys, `model.language_model.` prefix, `mtp.*`):
the writer's layout, and C1 of the converted checkpoint against transformers' Qwen3.5-MoE on the
same weights. Narrow widths keep it light; `REAL_WIDTHS_SLICE` itself is written by benchmarks only."""

import json

import torch
from safetensors import safe_open
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

from clover.checkpoint import ConvertOptions, convert_checkpoint
from clover.checkpoint.release_layout import REAL_WIDTHS_SLICE, release_shapes, write_release_checkpoint
from clover.model import CloverMoeForCausalLM

NARROW = dict(vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
              linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
              shared_expert_intermediate_size=32, eos_token_id=255, pad_token_id=255)


def stored_text_state(root) -> dict[str, torch.Tensor]:
    """The stored text-model tensors under transformers' in-memory names (experts fused)."""
    weight_map = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    state, experts = {}, {}
    for key, shard in weight_map.items():
        if key.startswith("mtp."):
            continue
        with safe_open(root / shard, framework="pt") as f:
            tensor = f.get_tensor(key).float()
        name = key.replace("model.language_model.", "model.")
        if ".mlp.experts." in name:
            prefix, e, proj, _ = name.rsplit(".", 3)
            experts.setdefault(prefix, {}).setdefault(int(e), {})[proj] = tensor
        else:
            state[name] = tensor
    for prefix, per_expert in experts.items():
        order = sorted(per_expert)
        state[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat((per_expert[e]["gate_proj"], per_expert[e]["up_proj"])) for e in order])
        state[f"{prefix}.down_proj"] = torch.stack([per_expert[e]["down_proj"] for e in order])
    return state


def test_real_widths_slice_shapes():
    shapes = release_shapes(Qwen3_5MoeTextConfig(**REAL_WIDTHS_SLICE))
    experts = "model.language_model.layers.0.mlp.experts"
    assert shapes[f"{experts}.255.gate_proj.weight"] == (512, 2048) and f"{experts}.256.up_proj.weight" not in shapes
    assert shapes["model.language_model.embed_tokens.weight"] == (248320, 2048)
    assert shapes["model.language_model.layers.0.linear_attn.in_proj_qkv.weight"] == (8192, 2048)
    assert shapes["model.language_model.layers.3.self_attn.q_proj.weight"] == (8192, 2048)  # 16 heads × 256 × 2
    assert shapes["model.language_model.layers.3.self_attn.k_proj.weight"] == (512, 2048)
    total = sum(torch.Size(s).numel() for s in shapes.values())
    assert 4.3e9 < total < 4.5e9  # 3.2B routed-expert weights + 1.0B embedding and head


def test_release_layout_converts_and_matches_transformers(tmp_path):
    src = write_release_checkpoint(tmp_path / "release", NARROW, seed=1, std=0.2, max_shard_bytes=400_000)
    weight_map = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(weight_map.values())) > 1 and "mtp.fc.weight" in weight_map
    assert "model.language_model.layers.0.mlp.experts.3.down_proj.weight" in weight_map
    assert not any(k.startswith("model.layers.") for k in weight_map)
    convert_checkpoint(src, tmp_path / "clover", ConvertOptions(dtype="fp32", mask_token_id=254))
    clover = CloverMoeForCausalLM.from_pretrained(tmp_path / "clover")
    reference = Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**NARROW)).eval()
    reference.load_state_dict(stored_text_state(src), strict=True)
    ids = torch.randint(0, 250, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = clover(ids).logits, reference(ids).logits
    assert (ours - theirs).abs().max() <= 1e-4  # C1, fp32
