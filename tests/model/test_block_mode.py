"""Block mode with a cache (SPEC §3.2-3.3): C2, C3, read-only block steps, empty prefix.

Tolerances (fp32): C2 and C3 logits 1e-4 (SPEC); the cache after a fused vs a split commit
atol 1e-6 + rtol 1e-5 (the two paths run GEMMs of different shapes, so the last bits differ);
block steps must leave the cache bit-identical.
"""

import pytest
import torch

from tiny import TINY_MASK as MASK
from tiny import random_ids as ids
from tiny import tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def prefill(model, prompt):
    cache = model.new_cache()
    with torch.no_grad():
        model(prompt, past_key_values=cache)
    return cache


def cache_tensors(cache):
    return [(i, name, t) for i, layer in enumerate(cache.layers) for name, t in layer.tensors().items()]


def assert_caches_equal(a, b, exact=True):
    assert a.get_seq_length() == b.get_seq_length()
    for (i, name, x), (_, _, y) in zip(cache_tensors(a), cache_tensors(b)):
        if exact:
            assert x is y or torch.equal(x, y), (i, name)
        else:
            assert x.shape == y.shape, (i, name)
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("block_len", [1, 4, 8, 32])
def test_c2_cached_block_equals_uncached_reference(model, block_len):
    seq = ids(2, 21 + block_len, seed=block_len)
    seq[:, -block_len:][:, ::2] = MASK  # a partly denoised block
    with torch.no_grad():
        reference = model(seq, block_len=block_len).logits[:, -block_len:]
        cache = prefill(model, seq[:, :-block_len])
        cached = model(seq[:, -block_len:], past_key_values=cache, block_len=block_len).logits
    torch.testing.assert_close(cached, reference, rtol=0, atol=1e-4)


def test_c2_holds_after_several_committed_blocks(model):
    """Prefill, then commit blocks one by one; each block step matches the uncached reference."""
    block_len = 4
    seq = ids(1, 9 + 3 * block_len, seed=3)
    cache = prefill(model, seq[:, :9])
    with torch.no_grad():
        for start in range(9, seq.shape[1], block_len):
            block = seq[:, start:start + block_len]
            cached = model(block, past_key_values=cache, block_len=block_len).logits
            reference = model(seq[:, :start + block_len], block_len=block_len).logits[:, -block_len:]
            torch.testing.assert_close(cached, reference, rtol=0, atol=1e-4)
            model(block, past_key_values=cache)  # commit
    assert cache.get_seq_length() == seq.shape[1]


@pytest.mark.parametrize("block_len", [2, 8])
def test_c3_fused_commit_and_denoise_equals_separate_forwards(model, block_len):
    prompt, finished = ids(2, 11, seed=1), ids(2, block_len, seed=2)
    masks = torch.full((2, block_len), MASK)
    split_cache, fused_cache = prefill(model, prompt), prefill(model, prompt)
    with torch.no_grad():
        commit_logits = model(finished, past_key_values=split_cache).logits
        denoise_logits = model(masks, past_key_values=split_cache, block_len=block_len).logits
        fused = model(torch.cat((finished, masks), 1), past_key_values=fused_cache, block_len=block_len).logits
    torch.testing.assert_close(fused[:, :block_len], commit_logits, rtol=0, atol=1e-4)
    torch.testing.assert_close(fused[:, block_len:], denoise_logits, rtol=0, atol=1e-4)
    assert_caches_equal(fused_cache, split_cache, exact=False)


def test_block_steps_leave_the_cache_bit_identical(model):
    cache = prefill(model, ids(2, 13))
    before = cache.clone()
    with torch.no_grad():
        for step in range(3):  # several denoising steps, with and without the coreset
            block = ids(2, 8, seed=10 + step)
            out = model(block, past_key_values=cache, block_len=8, use_coreset=bool(step % 2))
            assert out.past_key_values is cache
    assert_caches_equal(cache, before)


def test_block_step_after_a_fused_call_sees_only_the_committed_part(model):
    """The block keys of a fused call are not kept: the next call's attention cache holds the
    committed positions only."""
    cache = prefill(model, ids(1, 6))
    with torch.no_grad():
        model(torch.cat((ids(1, 4, seed=4), torch.full((1, 4), MASK)), 1), past_key_values=cache, block_len=4)
    attention = [layer for layer in cache.layers if hasattr(layer, "key")]
    assert cache.get_seq_length() == 10 and all(layer.key.shape[2] == 10 for layer in attention)


def test_block_mode_with_an_empty_prefix(model):
    """A block with nothing before it: no cache, an empty cache and a zero-length prefix agree; the
    empty cache stays empty."""
    block = ids(2, 8, seed=5)
    block[:, 3:] = MASK
    cache = model.new_cache()
    with torch.no_grad():
        no_cache = model(block, block_len=8).logits
        empty_cache = model(block, past_key_values=cache, block_len=8).logits
    torch.testing.assert_close(empty_cache, no_cache, rtol=0, atol=1e-6)
    assert cache.get_seq_length() == 0
    assert all(t is None for _, _, t in cache_tensors(cache))


def test_block_mode_differs_from_causal_mode(model):
    """Sanity: the block is bidirectional (position 0 depends on later block tokens), the causal
    pass is not."""
    block = ids(1, 8, seed=6)
    poked = block.clone()
    poked[0, -1] = (poked[0, -1] + 1) % MASK
    with torch.no_grad():
        a, b = model(block, block_len=8).logits, model(poked, block_len=8).logits
        c, d = model(block).logits, model(poked).logits
    assert (a[0, 0] - b[0, 0]).abs().max() > 1e-4
    torch.testing.assert_close(c[0, :-1], d[0, :-1], rtol=0, atol=1e-5)


def test_block_len_outside_the_input_is_refused(model):
    with pytest.raises(ValueError, match="block_len"):
        model(ids(1, 4), block_len=5)


def test_c2_is_exact_in_fp64_and_fp32_is_within_1e4_of_it():
    """In fp64 the cached block equals the uncached reference to rounding (the algebra agrees);
    the fp32 block logits stay within 1e-4 of the fp64 ones."""
    model = tiny_model(seed=2)
    model64 = tiny_model(seed=2).double()
    seq = ids(2, 20, seed=8)
    seq[:, -8::2] = MASK
    with torch.no_grad():
        reference = model64(seq, block_len=8).logits[:, -8:]
        cache = prefill(model64, seq[:, :-8])
        cached = model64(seq[:, -8:], past_key_values=cache, block_len=8).logits
        fp32 = model(seq, block_len=8).logits[:, -8:]
    assert reference.dtype == torch.float64
    torch.testing.assert_close(cached, reference, rtol=0, atol=1e-10)
    torch.testing.assert_close(fp32.double(), reference, rtol=0, atol=1e-4)
