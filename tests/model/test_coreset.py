"""The MoE block coreset in the model (SPEC §5, C5): top_p = 1 is plain routing, the reported
distinct-expert counts are the kept sets, and causal passes never use it."""

import pytest
import torch

from clover.model.moe import SparseMoeBlock, coreset_keep
from tiny import tiny_config, tiny_model

MASK, BLOCK = 127, 8
TOP_PS = (1.0, 0.95, 0.8, 0.6, 0.4, 0.1)


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=4)


@pytest.fixture(scope="module")
def setup(model):
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, MASK, (2, 9), generator=gen)
    block = torch.randint(0, MASK, (2, BLOCK), generator=gen)
    block[:, ::3] = MASK
    cache = model.new_cache()
    with torch.no_grad():
        model(prompt, past_key_values=cache)
    return prompt, block, cache


def block_step(model, block, cache, **kw):
    with torch.no_grad():
        return model(block, past_key_values=cache, block_len=BLOCK, **kw)


def test_top_p_one_equals_plain_routing(model, setup):
    _, block, cache = setup
    plain = block_step(model, block, cache, use_coreset=False)
    full = block_step(model, block, cache, use_coreset=True, coreset_top_p=1.0)
    assert torch.equal(full.logits, plain.logits)
    assert torch.equal(full.distinct_experts, plain.distinct_experts)


def test_reported_distinct_experts_are_the_kept_sets(model, setup):
    """Per layer and row, the count equals |coreset_keep| of that layer's block router probs."""
    _, block, cache = setup
    captured = []
    hooks = [layer.mlp.register_forward_pre_hook(lambda m, args: captured.append(args[0]))
             for layer in model.model.layers]
    try:
        for top_p in TOP_PS:
            captured.clear()
            out = block_step(model, block, cache, use_coreset=True, coreset_top_p=top_p)
            assert out.distinct_experts.shape == (len(model.model.layers), 2)
            for layer_idx, (mlp_in, layer) in enumerate(zip(captured, model.model.layers)):
                probs = layer.mlp.gate(mlp_in.flatten(0, 1)).view(2, BLOCK, -1)
                keep = coreset_keep(probs, layer.mlp.top_k, top_p)
                assert out.distinct_experts[layer_idx].tolist() == keep.sum(-1).tolist()
    finally:
        for hook in hooks:
            hook.remove()


def test_smaller_top_p_never_uses_more_experts(model, setup):
    _, block, cache = setup
    counts = [block_step(model, block, cache, use_coreset=True, coreset_top_p=p).distinct_experts
              for p in TOP_PS]
    for larger, smaller in zip(counts, counts[1:]):
        assert (smaller[0] <= larger[0]).all()  # layer 0 sees the same input for every top_p
    assert (counts[-1] < counts[0]).any()
    # every layer, on a fixed input
    torch.manual_seed(0)
    moe = SparseMoeBlock(tiny_config())
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.5)
        x = torch.randn(3, BLOCK, 32)
        per_p = [moe(x, BLOCK, p)[1] for p in TOP_PS]
    for larger, smaller in zip(per_p, per_p[1:]):
        assert (smaller <= larger).all()


def test_config_switch_and_override(model, setup):
    _, block, cache = setup
    default = block_step(model, block, cache)  # config: enabled, top_p 0.9
    explicit = block_step(model, block, cache, use_coreset=True, coreset_top_p=0.9)
    assert model.config.moe_block_coreset_enabled and model.config.moe_block_coreset_top_p == 0.9
    assert torch.equal(default.logits, explicit.logits)


def test_causal_passes_never_use_the_coreset(model, setup):
    prompt, block, _ = setup
    with torch.no_grad():
        plain = model(prompt, use_coreset=False)
        for top_p in (0.1, 0.5):
            out = model(prompt, use_coreset=True, coreset_top_p=top_p)
            assert torch.equal(out.logits, plain.logits) and out.distinct_experts is None
        # the causal part of a fused call and the cache it writes do not depend on top_p either (up
        # to the last bits: other block routing changes the expert GEMM shapes the causal rows go through)
        seq = torch.cat((prompt, block), 1)
        caches = [model.new_cache() for _ in range(2)]
        a = model(seq, past_key_values=caches[0], block_len=4, use_coreset=False).logits
        b = model(seq, past_key_values=caches[1], block_len=4, use_coreset=True, coreset_top_p=0.1).logits
    torch.testing.assert_close(a[:, :-4], b[:, :-4], rtol=0, atol=1e-5)
    assert (a[:, -4:] - b[:, -4:]).abs().max() > 1e-3
    for la, lb in zip(*(c.layers for c in caches)):
        for x, y in zip(la.tensors().values(), lb.tensors().values()):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-5)
