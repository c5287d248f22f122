"""The one-token bf16 CPU forward runs on PyTorch's GEMV kernel (oneDNN off for its duration) and
gives what the plain path (oneDNN on) gives, at bf16 precision."""

import pytest
import torch

import clover.model.modeling_clover_moe as cpu_kernels
from clover.model.modeling_clover_moe import matmul_kernels, prefers_native_gemv
from tiny import random_ids, tiny_model

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")


@needs_onednn
def test_only_one_row_bf16_on_cpu_switches():
    cpu = torch.device("cpu")
    assert prefers_native_gemv(1, torch.bfloat16, cpu)
    assert not prefers_native_gemv(2, torch.bfloat16, cpu)
    assert not prefers_native_gemv(1, torch.float32, cpu)
    assert not prefers_native_gemv(1, torch.bfloat16, torch.device("cuda"))


@needs_onednn
def test_switch_is_restored_after_an_error():
    with pytest.raises(RuntimeError):
        with matmul_kernels(1, torch.bfloat16, torch.device("cpu")):
            assert not torch.backends.mkldnn.enabled
            raise RuntimeError("inside")
    assert torch.backends.mkldnn.enabled


def onednn_seen(model, ids, **kwargs) -> tuple[torch.Tensor, list[bool]]:
    seen = []
    handle = model.lm_head.register_forward_pre_hook(lambda m, a: seen.append(torch.backends.mkldnn.enabled))
    with torch.no_grad():
        logits = model(ids, **kwargs).logits
    handle.remove()
    return logits, seen


@needs_onednn
def test_decode_step_matches_the_onednn_path(monkeypatch):
    model = tiny_model(seed=3, hidden_size=256, moe_intermediate_size=256, vocab_size=4096,
                       mask_token_id=4095).to(torch.bfloat16)
    cache = model.new_cache()
    with torch.no_grad():
        model(random_ids(1, 12), past_key_values=cache)
    step = random_ids(1, 1, seed=1)
    fast, seen_fast = onednn_seen(model, step, past_key_values=cache.snapshot())
    _, seen_block = onednn_seen(model, random_ids(1, 4), past_key_values=cache.snapshot(), block_len=4)
    monkeypatch.setattr(cpu_kernels, "prefers_native_gemv", lambda *args: False)
    plain, seen_plain = onednn_seen(model, step, past_key_values=cache.snapshot())
    assert seen_fast == [False] and seen_plain == [True] and seen_block == [True]
    assert torch.backends.mkldnn.enabled
    # same weights and inputs, different fp32 accumulation order: bf16 roundings apart
    scale = plain.float().abs().max().item()
    assert (fast.float() - plain.float()).abs().max().item() <= 0.02 * scale
    assert (fast.argmax(-1) == plain.argmax(-1)).all()
