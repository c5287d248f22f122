"""torch's packed CPU int4 / int8 kernels (`clover.model.quantized`) against the plain twin
(dequantize + float matmul): linears, routed experts, a whole tiny model (C2), the stored layout
kept by state_dict, and the fallbacks where no kernel applies. Models pack only in bf16 (where the
kernels pay); the fp32 cases pack with `dtypes=KERNEL_DTYPES` to check the kernels exactly.

Tolerances: fp32 — both paths compute the same dequantized products in a different order, so
1e-5 relative to the output's scale; bf16 — the kernels round partial sums to bf16 (the int8 path per
group of columns), so 2e-2 of the output's scale (a few bf16 ulps)."""

import copy

import pytest
import torch
from torch import nn

from clover.model import CloverMoeForCausalLM
from clover.model.cache import CloverCache
from clover.model.quantized import KERNELS_ENV, QuantizedLinear, QuantizedWeight, pack_quantized
from clover.model.quantized import INT8_KERNEL_MAX_ROWS, KERNEL_DTYPES, pack_int4, unpack_int4
from clover.quantization import quantize_model
from tiny import tiny_model

GROUP = 32
# widths that the kernels take: every quantized input width divisible by 32, every output by 16
KERNEL_TINY = dict(hidden_size=64, head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16,
                   moe_intermediate_size=32, shared_expert_intermediate_size=32)
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _close(fast: torch.Tensor, plain: torch.Tensor, dtype: torch.dtype) -> bool:
    scale = plain.float().abs().max()
    return bool((fast.float() - plain.float()).abs().max() <= TOLERANCE[dtype] * scale)


def _twin(module: nn.Module) -> nn.Module:
    """A copy of `module` with every quantized weight back in the stored layout (the plain path)."""
    plain = copy.deepcopy(module)
    for m in plain.modules():
        if isinstance(m, QuantizedWeight):
            m.unpack()
    return plain


def _linear(n: int, k: int, dtype: torch.dtype, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(k, n, bias=True).to(dtype)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_kernel_matches_plain_twin(bits, dtype):
    fast = QuantizedLinear.from_linear(_linear(48, 256, dtype, seed=bits), bits, GROUP)
    assert fast.pack(KERNEL_DTYPES) and fast.packed
    plain = _twin(fast)
    for rows in (1, INT8_KERNEL_MAX_ROWS, 33):  # INT8 beyond the row limit: the plain path on packed bytes
        x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)).to(dtype)
        with torch.no_grad():
            y_fast, y_plain = fast(x), plain(x)
        assert y_fast.dtype == dtype and y_fast.shape == (rows, 48)
        assert _close(y_fast, y_plain, dtype), (rows, (y_fast.float() - y_plain.float()).abs().max())
    assert fast.packed and not plain.packed


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_expert_kernel_matches_plain_twin(bits, dtype):
    w = torch.randn(4, 32, 128, generator=torch.Generator().manual_seed(7)).to(dtype)  # [E, N, K]
    fast = QuantizedWeight.from_float(w, bits, GROUP)
    assert fast.pack(KERNEL_DTYPES)
    plain = _twin(fast)
    x = torch.randn(2, 3, 128, generator=torch.Generator().manual_seed(8)).to(dtype)  # leading dims kept
    for e in range(4):
        with torch.no_grad():
            y_fast, y_plain = fast.matmul(x, e), plain.matmul(x, e)
        assert y_fast.shape == (2, 3, 32) and _close(y_fast, y_plain, dtype)


@pytest.mark.parametrize("bits", [4, 8])
def test_packing_keeps_the_stored_format(bits):
    """Packing is a reordering: state_dict writes the stored layout, and loads into a packed module."""
    linear = _linear(64, 128, torch.float32, seed=3)
    fast, plain = (QuantizedLinear.from_linear(linear, bits, GROUP) for _ in range(2))
    assert fast.pack(KERNEL_DTYPES) and not plain.packed
    assert not torch.equal(fast.qweight, plain.qweight)  # the layout differs in memory
    stored, reference = fast.state_dict(), plain.state_dict()
    assert stored.keys() == reference.keys() and all(torch.equal(stored[k], reference[k]) for k in stored)
    other = QuantizedLinear.from_linear(_linear(64, 128, torch.float32, seed=4), bits, GROUP)
    assert other.pack(KERNEL_DTYPES)
    other.load_state_dict(reference)
    x = torch.randn(3, 128)
    assert other.packed and torch.equal(other(x), fast(x))


def test_int4_unpack_inverts_pack_on_an_avx512_block_width():
    """N = 80: one full 64-row block and a partial one (the kernel tiles rows by 64 on AVX-512)."""
    qweight = torch.randint(0, 256, (2, 80, 96), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    packed = pack_int4(qweight)
    assert packed.shape == qweight.shape and not torch.equal(packed, qweight)
    assert torch.equal(unpack_int4(packed), qweight)


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_model_kernels_match_twin_and_keep_c2(bits):
    model = quantize_model(tiny_model(seed=9, scale=0.1, **KERNEL_TINY), bits, GROUP)
    weights = [m for m in model.modules() if isinstance(m, QuantizedWeight)]
    assert weights and not any(m.packed for m in weights)  # fp32: the kernels do not pay
    assert pack_quantized(model, KERNEL_DTYPES) == len(weights)
    plain = _twin(model)
    ids = torch.randint(0, 120, (2, 12), generator=torch.Generator().manual_seed(10))
    prefix, block = ids[:, :8], ids[:, 8:]
    with torch.no_grad():
        uncached = model(ids, block_len=4).logits[:, -4:]
        assert _close(uncached, plain(ids, block_len=4).logits[:, -4:], torch.float32)
        cache = CloverCache(model.config.layer_types)
        model(prefix, past_key_values=cache)
        cached = model(block, past_key_values=cache, block_len=4).logits
    assert torch.allclose(cached, uncached, atol=1e-4, rtol=0)  # C2
    assert all(m.packed for m in weights)


def test_fallbacks_where_no_kernel_applies(monkeypatch):
    # int4 at group 16 (the kernel takes 32..256) and at 40 output rows (not a multiple of 16)
    assert not QuantizedLinear.from_linear(_linear(48, 64, torch.float32, 0), 4, 16).pack()
    assert not QuantizedLinear.from_linear(_linear(40, 64, torch.float32, 0), 4, GROUP).pack()
    # an input the kernel does not take (float64) unpacks the weight and takes the plain path
    fast = QuantizedLinear.from_linear(_linear(48, 64, torch.float32, 1), 4, GROUP)
    assert fast.pack(KERNEL_DTYPES)
    plain = _twin(fast)
    x = torch.randn(2, 64, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(fast(x), plain(x)) and not fast.packed
    # under autograd as well (the kernels have no backward)
    grad_fast = QuantizedLinear.from_linear(_linear(48, 64, torch.float32, 1), 8, GROUP)
    assert grad_fast.pack(KERNEL_DTYPES)
    x = torch.randn(2, 64, requires_grad=True)
    grad_fast(x).sum().backward()
    assert not grad_fast.packed and x.grad is not None
    # CLOVER_QUANT_KERNELS=0: nothing is packed
    monkeypatch.setenv(KERNELS_ENV, "0")
    model = quantize_model(tiny_model(seed=11, **KERNEL_TINY), 4, GROUP)
    assert pack_quantized(model) == 0
    assert not any(m.packed for m in model.modules() if isinstance(m, QuantizedWeight))


def test_bf16_model_packs_and_checkpoint_loads_packed(tmp_path):
    model = quantize_model(tiny_model(seed=12, **KERNEL_TINY).to(torch.bfloat16), 4, GROUP)
    weights = [m for m in model.modules() if isinstance(m, QuantizedWeight)]
    assert all(m.packed for m in weights)
    ids = torch.randint(0, 120, (1, 8), generator=torch.Generator().manual_seed(13))
    model.save_pretrained(tmp_path / "int4")
    loaded = CloverMoeForCausalLM.from_pretrained(tmp_path / "int4")
    assert all(m.packed for m in loaded.modules() if isinstance(m, QuantizedWeight))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
