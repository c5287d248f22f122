"""The pooled cache (preallocated, written in place) against the growing one (differentiable).

Tolerances (fp32): logits of the two storage modes 1e-5 (same arithmetic, reads of a view vs a
concatenation); C2 and C3 on the pooled cache 1e-4 as in SPEC; a restored snapshot bit-identical.
"""

import pytest
import torch

from clover.model.cache import AttentionLayerCache, GatedDeltaNetLayerCache
from tiny import TINY_MASK as MASK
from tiny import random_ids as ids
from tiny import tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def run_blocks(model, cache, prompt, blocks, size):
    """Prefill, then per block a denoising step and a fused commit; returns every logits tensor."""
    out = [model(prompt, past_key_values=cache).logits]
    for block in blocks:
        noisy = block.clone()
        noisy[:, ::2] = MASK
        out.append(model(noisy, past_key_values=cache, block_len=size).logits)
        masks = torch.full_like(block, MASK)
        out.append(model(torch.cat((block, masks), 1), past_key_values=cache, block_len=size).logits)
    return out


@torch.no_grad()
def test_pooled_cache_gives_the_growing_cache_logits(model):
    size = 4
    prompt, blocks = ids(2, 11, 1), [ids(2, size, 10 + k) for k in range(3)]
    growing = run_blocks(model, model.new_cache(), prompt, blocks, size)
    pooled_cache = model.new_cache(capacity=11 + 4 * size)
    pooled = run_blocks(model, pooled_cache, prompt, blocks, size)
    for a, b in zip(growing, pooled):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
    assert pooled_cache.get_seq_length() == 11 + 3 * size


@torch.no_grad()
def test_pooled_cache_is_written_in_place(model):
    cache = model.new_cache(capacity=64)
    model(ids(1, 9), past_key_values=cache)
    attention = [layer for layer in cache.layers if isinstance(layer, AttentionLayerCache)][0]
    gdn = [layer for layer in cache.layers if isinstance(layer, GatedDeltaNetLayerCache)][0]
    key_ptr, state = attention.key.data_ptr(), gdn.recurrent_state
    model(ids(1, 5, 2), past_key_values=cache)
    assert attention.key.data_ptr() == key_ptr and attention.key.shape[2] == 14
    assert attention.key._base is attention.key_buffer  # a view of the buffer, no copy
    assert gdn.recurrent_state is state  # overwritten in place


@torch.no_grad()
def test_c2_on_the_pooled_cache(model):
    size = 8
    seq = ids(2, 17 + size, 3)
    seq[:, -size:][:, 1::2] = MASK
    reference = model(seq, block_len=size).logits[:, -size:]
    cache = model.new_cache(capacity=17 + size)
    model(seq[:, :-size], past_key_values=cache)
    cached = model(seq[:, -size:], past_key_values=cache, block_len=size).logits
    torch.testing.assert_close(cached, reference, rtol=0, atol=1e-4)
    assert cache.get_seq_length() == 17  # the block did not advance the cache


@torch.no_grad()
def test_c3_fused_commit_on_the_pooled_cache(model):
    size = 4
    prompt, block = ids(1, 10, 4), ids(1, size, 5)
    masks = torch.full_like(block, MASK)
    fused_cache, split_cache = model.new_cache(capacity=32), model.new_cache(capacity=32)
    model(prompt, past_key_values=fused_cache)
    model(prompt, past_key_values=split_cache)
    fused = model(torch.cat((block, masks), 1), past_key_values=fused_cache, block_len=size).logits[:, -size:]
    model(block, past_key_values=split_cache)
    split = model(masks, past_key_values=split_cache, block_len=size).logits
    torch.testing.assert_close(fused, split, rtol=0, atol=1e-4)


@torch.no_grad()
@pytest.mark.parametrize("capacity", [0, 40])
def test_restore_rolls_back_to_the_snapshot(model, capacity):
    cache = model.new_cache(capacity)
    model(ids(1, 12, 6), past_key_values=cache)
    saved = cache.snapshot()
    before = [{k: v.clone() for k, v in layer.tensors().items()} for layer in cache.layers]
    model(ids(1, 7, 7), past_key_values=cache)  # e.g. a verify pass
    cache.restore(saved)
    assert cache.get_seq_length() == 12
    for layer, old in zip(cache.layers, before):
        for name, tensor in layer.tensors().items():
            assert torch.equal(tensor, old[name]), name


def test_a_pooled_cache_refuses_to_overflow(model):
    cache = model.new_cache(capacity=8)
    with torch.no_grad(), pytest.raises(ValueError, match="holds 8 positions; this forward needs 10"):
        model(ids(1, 10), past_key_values=cache)


def test_the_growing_cache_keeps_gradients(model):
    """Training back-propagates through the cache: the growing mode must stay differentiable."""
    cache = model.new_cache()
    model(ids(1, 6), past_key_values=cache)
    logits = model(ids(1, 4, 8), past_key_values=cache, block_len=4).logits
    logits.sum().backward()
    grad = model.model.embed_tokens.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    model.zero_grad(set_to_none=True)
