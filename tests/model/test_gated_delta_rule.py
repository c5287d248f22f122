"""The gated delta rule: `chunk` == `recurrent` == `naive` (outputs, final state, gradients).

Tolerance: the fp32 implementations are compared with the naive rule run in fp64, by the max error
relative to max(1, largest reference magnitude) (`rel_err`; the floor keeps an all-zero reference,
e.g. dL/dg at T=1 from a zero state, from dividing by zero), at 1e-5 for values and gradients.
"""

import pytest
import torch
import torch.nn.functional as F

from clover.model.gated_delta_net import (
    chunk_gated_delta_rule, gated_delta_rule, naive_gated_delta_rule, recurrent_gated_delta_rule)

VALUE_TOL = GRAD_TOL = 1e-5
B, H, DK, DV = 2, 3, 16, 8


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1.0)).item()


def make_inputs(t: int, with_state: bool, seed: int = 0):
    """Leaf tensors (fp32) in the layout the rule takes: q, k l2-normalised, g <= 0, beta in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, t, H, DK, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, t, H, DK, generator=gen), dim=-1)
    v = torch.randn(B, t, H, DV, generator=gen)
    g = -F.softplus(torch.randn(B, t, H, generator=gen)) * 0.5
    beta = torch.rand(B, t, H, generator=gen)
    state = torch.randn(B, H, DK, DV, generator=gen) if with_state else None
    leaves = [q, k, v, g, beta] + ([state] if with_state else [])
    return [x.requires_grad_() for x in leaves]


def run(fn, inputs, dtype=torch.float32, **kw):
    """Forward + backward of a fixed random functional of (o, S_T); returns o, S_T and the grads."""
    leaves = [x.detach().to(dtype).requires_grad_() for x in inputs]
    q, k, v, g, beta, *state = leaves
    o, s = fn(q, k, v, g, beta, DK ** -0.5, state[0] if state else None, **kw)
    gen = torch.Generator().manual_seed(1)
    w_o = torch.randn(o.shape, generator=gen).to(dtype)
    w_s = torch.randn(s.shape, generator=gen).to(dtype)
    ((o * w_o).sum() + (s * w_s).sum()).backward()
    return o.detach(), s.detach(), [x.grad for x in leaves]


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("t", [1, 5, 64, 100])
def test_chunk_and_recurrent_match_naive(t, with_state):
    inputs = make_inputs(t, with_state, seed=t)
    ref_o, ref_s, ref_grads = run(naive_gated_delta_rule, inputs, torch.float64)
    for fn, kw in ((recurrent_gated_delta_rule, {}), (chunk_gated_delta_rule, {"chunk_size": 64}),
                   (chunk_gated_delta_rule, {"chunk_size": 16}), (chunk_gated_delta_rule, {"chunk_size": 7})):
        o, s, grads = run(fn, inputs, **kw)
        assert o.dtype == torch.float32 and s.shape == (B, H, DK, DV)
        assert rel_err(o, ref_o) < VALUE_TOL, (fn.__name__, kw)
        assert rel_err(s, ref_s) < VALUE_TOL, (fn.__name__, kw)
        for name, grad, ref in zip("q k v g beta initial_state".split(), grads, ref_grads):
            assert rel_err(grad, ref) < GRAD_TOL, (fn.__name__, kw, name)


def test_chunk_equals_recurrent_in_fp32():
    inputs = make_inputs(37, with_state=True, seed=3)
    o1, s1, g1 = run(recurrent_gated_delta_rule, inputs)
    o2, s2, g2 = run(chunk_gated_delta_rule, inputs, chunk_size=8)
    assert rel_err(o2, o1) < VALUE_TOL and rel_err(s2, s1) < VALUE_TOL
    for a, b in zip(g2, g1):
        assert rel_err(a, b) < GRAD_TOL


def test_split_sequence_carries_the_state():
    """Running T tokens at once equals running them in two calls with the state handed over."""
    q, k, v, g, beta = (x.detach() for x in make_inputs(50, with_state=False))
    o, s = chunk_gated_delta_rule(q, k, v, g, beta, DK ** -0.5)
    o1, s1 = chunk_gated_delta_rule(q[:, :30], k[:, :30], v[:, :30], g[:, :30], beta[:, :30], DK ** -0.5)
    o2, s2 = recurrent_gated_delta_rule(q[:, 30:], k[:, 30:], v[:, 30:], g[:, 30:], beta[:, 30:],
                                        DK ** -0.5, s1)
    assert rel_err(torch.cat((o1, o2), 1), o) < VALUE_TOL and rel_err(s2, s) < VALUE_TOL


def test_low_precision_inputs_compute_in_fp32():
    q, k, v, g, beta, s0 = (x.detach() for x in make_inputs(20, with_state=True))
    o, s = chunk_gated_delta_rule(q, k, v.bfloat16(), g, beta.bfloat16(), DK ** -0.5, s0)
    ref_o, ref_s = chunk_gated_delta_rule(q, k, v.bfloat16().float(), g, beta.bfloat16().float(),
                                          DK ** -0.5, s0)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
    torch.testing.assert_close(s, ref_s, rtol=0, atol=0)
    torch.testing.assert_close(o, ref_o.bfloat16(), rtol=0, atol=0)


def test_initial_state_is_not_mutated():
    q, k, v, g, beta, s0 = (x.detach() for x in make_inputs(9, with_state=True))
    before = s0.clone()
    for fn in (naive_gated_delta_rule, recurrent_gated_delta_rule, chunk_gated_delta_rule, gated_delta_rule):
        fn(q, k, v, g, beta, DK ** -0.5, s0)
        assert torch.equal(s0, before), fn.__name__
