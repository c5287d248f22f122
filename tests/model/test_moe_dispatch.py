"""Expert dispatch and the block coreset (SPEC §5): grouped dispatch (grouped_mm and loop paths)
against the `naive_forward` twin (fp32: rtol=atol=1e-5 on outputs, rtol 1e-4 on gradients; only
the summation order differs), and `coreset_keep` / `coreset_routing` properties."""

import pytest
import torch

from clover.model.moe import (Experts, Routing, coreset_keep, coreset_routing, distinct_experts,
                              topk_routing, use_grouped_mm)
from tiny import tiny_config

E, TOP_K = 8, 2


def experts(seed: int = 0) -> Experts:
    torch.manual_seed(seed)
    module = Experts(tiny_config())
    with torch.no_grad():
        module.gate_up_proj.normal_(0, 0.3)
        module.down_proj.normal_(0, 0.3)
    return module


def block_probs(batch: int, length: int, seed: int = 0, sharpness: float = 2.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, length, E, generator=gen) * sharpness).softmax(-1)


@pytest.mark.parametrize("n", [1, 3, 17])
def test_grouped_dispatch_matches_naive(n):
    module = experts()
    x = torch.randn(n, 32)
    routing = topk_routing(block_probs(1, n, seed=n)[0], TOP_K)
    torch.testing.assert_close(module(x, routing), module.naive_forward(x, routing), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [1, 17])
def test_inference_path_uses_grouped_mm_and_matches_the_loop_and_naive(n):
    module = experts()
    x = torch.randn(n, 32)
    routing = topk_routing(block_probs(1, n, seed=n)[0], TOP_K)
    with torch.no_grad():
        assert use_grouped_mm(x, module.gate_up_proj)
        fast = module(x, routing)
        naive = module.naive_forward(x, routing)
        rows = torch.randn(9, 32)
        counts = torch.tensor([2, 0, 3, 0, 0, 4, 0, 0])
        torch.testing.assert_close(module.grouped_mm_forward(rows, counts), module.loop_forward(rows, counts),
                                   rtol=1e-5, atol=1e-5)
    assert not use_grouped_mm(x.requires_grad_(), module.gate_up_proj)  # autograd takes the loop
    torch.testing.assert_close(fast, naive, rtol=1e-5, atol=1e-5)


def test_bf16_dispatch_matches_naive():
    module = experts().to(torch.bfloat16)
    x = torch.randn(12, 32, dtype=torch.bfloat16)
    routing = topk_routing(block_probs(1, 12, seed=4)[0], TOP_K)
    routing = Routing(routing.weights.to(torch.bfloat16), routing.experts)
    with torch.no_grad():
        torch.testing.assert_close(module(x, routing).float(), module.naive_forward(x, routing).float(),
                                   rtol=2e-2, atol=2e-2)


def test_grouped_dispatch_skips_zero_weight_slots_and_matches_naive():
    module = experts()
    x = torch.randn(6, 32)
    routing = coreset_routing(block_probs(1, 6, seed=5), TOP_K, top_p=0.3)
    assert (routing.weights == 0).any()  # some tokens have fewer than k kept experts
    kept = set(routing.experts[routing.weights > 0].tolist())
    called = []
    original = module._expert
    module._expert = lambda e, rows: called.append(e) or original(e, rows)
    torch.testing.assert_close(module(x, routing), module.naive_forward(x, routing), rtol=1e-5, atol=1e-5)
    assert set(called[:len(kept)]) == kept and len(called) == len(kept) + module.num_experts  # + naive


def test_grouped_dispatch_gradients_match_naive():
    module = experts()
    x = torch.randn(5, 32, requires_grad=True)
    probs = block_probs(1, 5, seed=2)[0].requires_grad_()
    grads = []
    for fn in (module.forward, module.naive_forward):
        module.zero_grad()
        x.grad = probs.grad = None
        routing = topk_routing(probs, TOP_K)
        fn(x, routing).pow(2).sum().backward()
        grads.append((x.grad, probs.grad, module.gate_up_proj.grad, module.down_proj.grad))
    for fast, ref in zip(*grads):
        torch.testing.assert_close(fast, ref, rtol=1e-4, atol=1e-5)


def aggregated_mass(probs: torch.Tensor) -> torch.Tensor:
    """A[b, e] = Σ_t Σ_{e ∈ topk(t)} P[b, t, e], by a plain loop."""
    mass = torch.zeros(probs.shape[0], E, dtype=probs.dtype)
    for b in range(probs.shape[0]):
        for t in range(probs.shape[1]):
            for e in probs[b, t].topk(TOP_K).indices.tolist():
                mass[b, e] += probs[b, t, e]
    return mass


@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.99])
def test_coreset_keep_covers_top_p_of_the_mass_with_the_fewest_experts(top_p):
    probs = block_probs(3, 8, seed=int(top_p * 100))
    keep = coreset_keep(probs, TOP_K, top_p)
    mass = aggregated_mass(probs)
    for b in range(3):
        kept = mass[b][keep[b]]
        assert kept.sum() >= top_p * mass[b].sum() * (1 - 1e-6)
        dropped = mass[b][~keep[b]]
        assert dropped.numel() == 0 or kept.min() >= dropped.max()  # the heaviest are the kept ones
        # one fewer expert (drop the lightest kept) would not reach top_p
        assert kept.sum() - kept.min() < top_p * mass[b].sum()
        assert (mass[b][keep[b]] > 0).all()


def test_coreset_keep_top_p_one_keeps_every_chosen_expert():
    probs = block_probs(2, 8, seed=7, sharpness=30.0)  # peaked router: tiny k-th probabilities
    assert torch.equal(coreset_keep(probs, TOP_K, 1.0), aggregated_mass(probs) > 0)


def test_smaller_top_p_never_keeps_more_experts():
    probs = block_probs(4, 16, seed=11)
    sizes = [coreset_keep(probs, TOP_K, p).sum(-1) for p in (1.0, 0.95, 0.8, 0.6, 0.4, 0.2, 0.05)]
    for larger, smaller in zip(sizes, sizes[1:]):
        assert (smaller <= larger).all()


def test_coreset_routing_uses_only_kept_experts_renormalised():
    probs = block_probs(2, 8, seed=3)
    keep = coreset_keep(probs, TOP_K, 0.6)
    routing = coreset_routing(probs, TOP_K, 0.6)
    weights, chosen = routing.weights.view(2, 8, TOP_K), routing.experts.view(2, 8, TOP_K)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 8))
    for b in range(2):
        used = chosen[b][weights[b] > 0]
        assert keep[b, used].all()
    used_rows = distinct_experts(routing, 2, E)
    assert (used_rows <= keep.sum(-1)).all()


def test_coreset_routing_top_p_one_equals_plain_routing():
    probs = block_probs(2, 8, seed=9)
    plain = topk_routing(probs.flatten(0, 1), TOP_K)
    core = coreset_routing(probs, TOP_K, 1.0)
    assert torch.equal(core.experts, plain.experts) and torch.equal(core.weights, plain.weights)


def test_distinct_experts_counts_nonzero_slots_per_row():
    routing = Routing(weights=torch.tensor([[0.5, 0.5], [1.0, 0.0], [0.7, 0.3], [0.6, 0.4]]),
                      experts=torch.tensor([[0, 1], [1, 5], [2, 3], [2, 3]]))
    assert distinct_experts(routing, 2, E).tolist() == [2, 2]
