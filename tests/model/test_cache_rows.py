"""One forward over rows that each own a pooled batch-1 cache (`RowsCache`, the server's cache-pool
slots) against each row run alone on its own cache.

Tolerances (fp32): logits 1e-5 (each row attends over its own keys, unpadded, as alone; the
batched projections and experts may round differently by batch size); the cache contents after
`commit` 1e-5; an uncommitted forward changes no row, bit for bit.
"""

import pytest
import torch

from clover.model.cache import AttentionLayerCache, GatedDeltaNetLayerCache, RowsCache
from tiny import TINY_MASK as MASK
from tiny import random_ids as ids
from tiny import tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def rows_forward(model, caches, new: list[torch.Tensor], block_len: int):
    """A left-padded forward of row tokens `new[r]` [T_r] over `caches`; returns (logits, rows)."""
    width = max(len(t) for t in new)
    pads = [width - len(t) for t in new]
    input_ids = torch.stack([torch.cat((torch.zeros(p, dtype=torch.long), t)) for p, t in zip(pads, new)])
    rows = RowsCache(caches, pads)
    new_mask = torch.stack([torch.arange(width) >= p for p in pads]).long()
    mask = torch.cat((rows.key_mask("cpu"), new_mask), 1)
    out = model(input_ids, attention_mask=mask, past_key_values=rows, block_len=block_len,
                logits_to_keep=max(block_len, 1))
    return out.logits, rows


def assert_same_cache(a, b, atol=1e-5):
    assert a.get_seq_length() == b.get_seq_length()
    for la, lb in zip(a.layers, b.layers):
        for name, t in la.tensors().items():
            torch.testing.assert_close(lb.tensors()[name], t, rtol=0, atol=atol, msg=name)


@torch.no_grad()
def test_rows_of_different_lengths_compute_what_each_computes_alone(model):
    size = 4
    prompts = [ids(1, n, seed=n)[0] for n in (5, 11, 8)]
    pooled = [model.new_cache(capacity=64) for _ in prompts]
    alone = [model.new_cache(capacity=64) for _ in prompts]
    masks = torch.full((size,), MASK)
    # prefill, left-padded over empty caches, fused with a first block
    logits, rows = rows_forward(model, pooled, [torch.cat((p, masks)) for p in prompts], size)
    rows.commit([len(p) for p in prompts])
    for r, (p, cache) in enumerate(zip(prompts, alone)):
        ref = model(torch.cat((p, masks))[None], past_key_values=cache, block_len=size).logits[:, -size:]
        torch.testing.assert_close(logits[r:r + 1], ref, rtol=0, atol=1e-5)
        assert_same_cache(cache, pooled[r])
    # a denoising step (reads only), then a fused commit: every row appends `size` tokens
    blocks = [ids(1, size, seed=20 + r)[0] for r in range(len(prompts))]
    noisy = [b.masked_fill(torch.arange(size) % 2 == 0, MASK) for b in blocks]
    logits, rows = rows_forward(model, pooled, noisy, size)
    rows.commit([0] * len(prompts))
    for r, cache in enumerate(alone):
        ref = model(noisy[r][None], past_key_values=cache, block_len=size).logits
        torch.testing.assert_close(logits[r:r + 1], ref, rtol=0, atol=1e-5)
    logits, rows = rows_forward(model, pooled, [torch.cat((b, masks)) for b in blocks], size)
    rows.commit([size] * len(prompts))
    for r, cache in enumerate(alone):
        ref = model(torch.cat((blocks[r], masks))[None], past_key_values=cache, block_len=size).logits[:, -size:]
        torch.testing.assert_close(logits[r:r + 1], ref, rtol=0, atol=1e-5)
        assert_same_cache(cache, pooled[r])


@torch.no_grad()
def test_rows_are_read_and_written_in_place_and_only_on_commit(model):
    caches = [model.new_cache(capacity=32) for _ in range(2)]
    _, rows = rows_forward(model, caches, [ids(1, 6, 1)[0], ids(1, 9, 2)[0]], 0)
    rows.commit([6, 9])
    attention = [next(x for x in c.layers if isinstance(x, AttentionLayerCache)) for c in caches]
    gdn = [next(x for x in c.layers if isinstance(x, GatedDeltaNetLayerCache)) for c in caches]
    pointers = [a.key_buffer.data_ptr() for a in attention]
    states = [g.recurrent_state for g in gdn]
    before = [{i: {k: v.clone() for k, v in layer.tensors().items()} for i, layer in enumerate(c.layers)}
              for c in caches]
    _, rows = rows_forward(model, caches, [ids(1, 3, 3)[0], ids(1, 3, 4)[0]], 0)  # not committed
    assert [c.get_seq_length() for c in caches] == [6, 9]
    for cache, old in zip(caches, before):
        for i, layer in enumerate(cache.layers):
            for name, t in layer.tensors().items():
                assert torch.equal(t, old[i][name]), name
    rows.commit([3, 3])
    assert [c.get_seq_length() for c in caches] == [9, 12]
    assert [a.key_buffer.data_ptr() for a in attention] == pointers  # no new storage
    assert all(a.key._base is a.key_buffer for a in attention)
    assert all(g.recurrent_state is s for g, s in zip(gdn, states))  # overwritten in place


def test_rows_need_pooled_caches(model):
    with pytest.raises(ValueError, match="pooled"):
        RowsCache([model.new_cache()], [0])
