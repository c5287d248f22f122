"""Block attention: the prefix/block visibility mask and SDPA against the `naive_attention` twin
(fp32, atol 1e-5)."""

import torch
import torch.nn.functional as F

from clover.model.attention import naive_attention, prefix_block_mask
from tiny import tiny_model


def test_mask_is_causal_over_the_prefix_and_full_inside_the_block():
    real = torch.ones(1, 6, dtype=torch.bool)
    mask = prefix_block_mask(real, num_new=4, block_len=3)[0, 0]  # 2 cached + 1 causal + 3 block
    expected = torch.tensor([
        [1, 1, 1, 0, 0, 0],  # the causal token at key 2
        [1, 1, 1, 1, 1, 1],  # block tokens see the prefix and the whole block
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(mask, expected)


def test_mask_hides_padding_but_keeps_the_diagonal():
    real = torch.tensor([[False, False, True, True, True]])
    mask = prefix_block_mask(real, num_new=5, block_len=2)[0, 0]
    assert mask[0].tolist() == [True, False, False, False, False]  # a pad query sees only itself
    assert mask[2].tolist() == [False, False, True, False, False]
    assert mask[4].tolist() == [False, False, True, True, True]
    assert mask[3].tolist() == [False, False, True, True, True]


def test_sdpa_matches_naive_attention_with_gqa():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 8, generator=gen)
    k, v = torch.randn(2, 2, 9, 8, generator=gen), torch.randn(2, 2, 9, 8, generator=gen)
    real = torch.ones(2, 9, dtype=torch.bool)
    real[1, :3] = False
    mask = prefix_block_mask(real, num_new=5, block_len=3)
    fast = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(fast, naive_attention(q, k, v, mask, 0.3), rtol=0, atol=1e-5)


def test_model_block_attention_matches_the_naive_twin(monkeypatch):
    """The whole model in block mode with a cache, SDPA swapped for the naive twin."""
    model = tiny_model()
    ids = torch.randint(0, 120, (2, 14), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 14, dtype=torch.long)
    mask[0, :3] = 0

    def run():
        cache = model.new_cache()
        with torch.no_grad():
            model(ids[:, :10], attention_mask=mask[:, :10], past_key_values=cache)
            return model(ids[:, 10:], attention_mask=mask, past_key_values=cache, block_len=4).logits

    fast = run()
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda q, k, v, attn_mask, scale, enable_gqa: naive_attention(q, k, v, attn_mask, scale))
    torch.testing.assert_close(fast, run(), rtol=0, atol=1e-5)
