"""Weight-only INT8 / INT4: the format against torch's int4pack kernel, the quantized model (error,
what stays float, C2/C3), and quantized checkpoints (CLI, reload, trust_remote_code)."""

import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parents[1] / "checkpoint"))
from ckpt_helpers import run_python  # noqa: E402
from clover.cli.main import main  # noqa: E402
from clover.model import CloverMoeForCausalLM  # noqa: E402
from clover.model.cache import CloverCache  # noqa: E402
from clover.model.quantized import QuantizedLinear, QuantizedWeight, dequantize_weight, quantize_weight  # noqa: E402
from clover.quantization import layer_errors, parse_quantize, quantize_model, quantized_bytes  # noqa: E402
from tiny import tiny_config, tiny_model  # noqa: E402

GROUP = 16  # divides every quantized width of the tiny config (32 and 16)
IDS = torch.randint(0, 120, (2, 12), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("bits", [8, 4])
def test_roundtrip_error_is_at_most_half_a_step(bits):
    w = torch.randn(3, 24, 64, generator=torch.Generator().manual_seed(1))  # [E, N, K]
    q = quantize_weight(w, bits, 32)
    assert q["qweight"].shape == ((3, 24, 32) if bits == 4 else (3, 24, 64)) and q["scales"].shape == (3, 24, 2)
    back = dequantize_weight(q["qweight"], q["scales"], q.get("zeros"), 32, torch.float32)
    step = q["scales"].repeat_interleave(32, dim=-1)
    assert ((back - w).abs() <= step / 2 + 1e-6).all()


def test_int4_format_matches_torch_int4pack_kernel():
    """Independent twin: torch's CPU int4 matmul reads our scales and zeros (w = (q-8)·s + z)."""
    w = torch.randn(32, 128, generator=torch.Generator().manual_seed(2))
    q = quantize_weight(w, 4, 64)
    nibbles = torch.stack((q["qweight"] & 15, q["qweight"] >> 4), -1).flatten(-2).to(torch.int32)  # [N, K]
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(nibbles, 1)
    scales_and_zeros = torch.stack((q["scales"], q["zeros"]), -1).transpose(0, 1).contiguous()  # [K/g, N, 2]
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(3))
    kernel = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 64, scales_and_zeros)
    reference = QuantizedLinear.from_linear(_linear(w), 4, 64)(x)
    assert torch.allclose(kernel, reference, atol=1e-4, rtol=1e-5)


def _linear(w: torch.Tensor) -> nn.Linear:
    linear = nn.Linear(w.shape[1], w.shape[0], bias=False)
    linear.weight.data = w
    return linear


@pytest.mark.parametrize("bits,max_error", [(8, 0.03), (4, 0.15)])
def test_quantized_model_error_and_what_stays_float(bits, max_error):
    """Weights ~ N(0, 0.05) (at 0.2 the random tiny model is chaotic: routing flips amplify any error)."""
    ref = tiny_model(seed=4, scale=0.05)
    q = quantize_model(tiny_model(seed=4, scale=0.05), bits, GROUP)
    layer = q.model.layers[0]
    assert isinstance(layer.linear_attn.in_proj_qkv, QuantizedLinear)
    assert isinstance(q.model.layers[3].self_attn.o_proj, QuantizedLinear)
    assert isinstance(layer.mlp.experts.gate_up_proj, QuantizedWeight)
    for kept in (layer.linear_attn.in_proj_a, layer.linear_attn.in_proj_b, layer.mlp.shared_expert_gate, q.lm_head):
        assert type(kept) is nn.Linear
    assert layer.mlp.gate.weight.is_floating_point() and layer.linear_attn.conv1d.weight.is_floating_point()
    errors = layer_errors(ref, q, IDS)
    assert errors[-1].name == "logits" and len(errors) == 5
    assert all(0 < e.relative < max_error for e in errors), errors
    assert q.config.quantization_config == {"quant_method": "clover_weight_only", "bits": bits, "group_size": GROUP}


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_model_keeps_c2_and_c3(bits):
    model = quantize_model(tiny_model(seed=5), bits, GROUP)
    prefix, block = IDS[:, :8], IDS[:, 8:]
    with torch.no_grad():
        uncached = model(torch.cat((prefix, block), 1), block_len=4).logits[:, -4:]
        cache = CloverCache(model.config.layer_types)
        model(prefix, past_key_values=cache)
        cached = model(block, past_key_values=cache, block_len=4).logits
        assert torch.allclose(cached, uncached, atol=1e-4, rtol=0)  # C2
        fused_cache, split_cache = CloverCache(model.config.layer_types), CloverCache(model.config.layer_types)
        model(prefix[:, :4], past_key_values=fused_cache)
        model(prefix[:, :4], past_key_values=split_cache)
        fused = model(torch.cat((prefix[:, 4:], block), 1), past_key_values=fused_cache, block_len=4).logits[:, -4:]
        model(prefix[:, 4:], past_key_values=split_cache)
        split = model(block, past_key_values=split_cache, block_len=4).logits
        assert torch.allclose(fused, split, atol=1e-4, rtol=0)  # C3


def test_bad_settings_are_refused_before_any_change():
    model = tiny_model(seed=6)
    with pytest.raises(ValueError, match="group_size=64 does not divide the 32 input columns"):
        quantize_model(model, 4, 64)
    with pytest.raises(ValueError, match="bits=3"):
        quantize_model(model, 3, GROUP)
    assert type(model.model.layers[0].linear_attn.in_proj_qkv) is nn.Linear
    with pytest.raises(ValueError, match="already quantized"):
        quantize_model(quantize_model(model, 8, GROUP), 8, GROUP)
    assert parse_quantize("int4") == 4 and parse_quantize(None) is None
    with pytest.raises(ValueError, match="int2"):
        parse_quantize("int2")


def test_bytes_per_parameter():
    config = tiny_config(hidden_size=256, moe_intermediate_size=128, shared_expert_intermediate_size=128,
                         head_dim=32, linear_key_head_dim=32, linear_value_head_dim=32)
    floats, int8, int4 = (quantized_bytes(config, bits, 128) for bits in (None, 8, 4))
    expert_params = config.num_hidden_layers * config.num_experts * 3 * 256 * 128
    # the routed experts alone save (2 - 1 - 2/128) bytes per weight at int8, (2 - 0.5 - 4/128) at int4
    assert floats - int8 > expert_params * (1 - 2 / 128) and floats - int4 > expert_params * (1.5 - 4 / 128)
    weight = QuantizedWeight((128, 256), 4, 128, torch.bfloat16)
    assert sum(p.numel() * p.element_size() for p in weight.parameters()) == 128 * 128 + 2 * 128 * 2 * 2


def test_quantize_command_and_reload(tmp_path):
    tiny_model(seed=7).save_pretrained(tmp_path / "fp32")
    assert main(["quantize", str(tmp_path / "fp32"), str(tmp_path / "int4"), "--bits", "4",
                 "--group-size", str(GROUP)]) == 0
    config = json.loads((tmp_path / "int4" / "config.json").read_text())
    assert config["quantization_config"]["bits"] == 4
    loaded = CloverMoeForCausalLM.from_pretrained(tmp_path / "int4")
    in_memory = quantize_model(tiny_model(seed=7), 4, GROUP)
    with torch.no_grad():
        assert torch.equal(loaded(IDS, block_len=4).logits, in_memory(IDS, block_len=4).logits)
    assert loaded.model.layers[0].mlp.experts.down_proj.qweight.dtype == torch.uint8
    script = f"""
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained({str(tmp_path / 'int4')!r}, trust_remote_code=True)
with torch.no_grad():
    torch.save(model(torch.tensor({IDS.tolist()!r}), block_len=4).logits, {str(tmp_path / 'remote.pt')!r})
print(type(model.model.layers[0].mlp.experts.down_proj).__module__)
"""
    out = run_python(script, cwd=tmp_path, env={"HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"})
    assert out.strip().splitlines()[-1].startswith("transformers_modules")
    with torch.no_grad():
        assert torch.equal(torch.load(tmp_path / "remote.pt"), in_memory(IDS, block_len=4).logits)


def test_light_modules_mirror_the_quantization_constants():
    """clover.loading and clover.cli.quantize copy two constants to stay free of torch imports."""
    from clover.cli.quantize import DEFAULT_GROUP_SIZE as CLI_GROUP_SIZE
    from clover.loading import QUANTIZE_SCHEMES
    from clover.quantization import DEFAULT_GROUP_SIZE, QUANTIZE_CHOICES

    assert tuple(QUANTIZE_CHOICES) == QUANTIZE_SCHEMES
    assert CLI_GROUP_SIZE == DEFAULT_GROUP_SIZE
