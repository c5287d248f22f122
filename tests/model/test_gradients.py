"""Gradients flow through block mode and through the cache (needed by training, SPEC §8)."""

import torch

from tiny import tiny_model

MASK = 127


def test_backward_through_block_mode_and_the_cache():
    model = tiny_model().train()
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, MASK, (2, 10), generator=gen)
    block = torch.full((2, 4), MASK)
    cache = model.new_cache()
    model(prompt, past_key_values=cache)  # with grad: the cached state is part of the graph
    logits = model(block, past_key_values=cache, block_len=4, use_coreset=True).logits
    logits.logsumexp(-1).sum().backward()  # a loss on the block logits only

    grads = {name: p.grad for name, p in model.named_parameters()}
    assert all(g is None or torch.isfinite(g).all() for g in grads.values())

    def nonzero(name):
        return grads[name] is not None and grads[name].abs().sum() > 0

    # block-mode parameters
    for name in ("conv_right_weight", "logit_scale", "history_bias", "history_c"):
        assert nonzero(f"model.layers.0.linear_attn.{name}"), name
    assert nonzero("model.layers.0.mlp.gate.weight") and nonzero("model.layers.0.mlp.experts.gate_up_proj")
    # parameters only the causal prefill uses reach the block loss through the cached state
    assert nonzero("model.layers.0.linear_attn.A_log") and nonzero("model.layers.0.linear_attn.in_proj_b.weight")
    assert nonzero("model.layers.3.self_attn.k_proj.weight")


def test_uncached_reference_backward_matches_cached():
    """The same block loss through the uncached reference forward gives the same gradients
    (fp32 rounding only: atol 1e-5, rtol 1e-4)."""
    gen = torch.Generator().manual_seed(1)
    seq = torch.randint(0, MASK, (1, 12), generator=gen)
    grads = []
    for cached in (False, True):
        model = tiny_model()
        if cached:
            cache = model.new_cache()
            model(seq[:, :8], past_key_values=cache)
            logits = model(seq[:, 8:], past_key_values=cache, block_len=4, use_coreset=False).logits
        else:
            logits = model(seq, block_len=4, use_coreset=False).logits[:, -4:]
        logits.pow(2).mean().backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-5, msg=name)
