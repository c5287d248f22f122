"""Depthwise convolutions of the Gated DeltaNet: causal taps, right branch, block-mode sum (exact up to
fp32 summation order: atol 1e-6)."""

import torch

from clover.model.gated_delta_net import block_conv, causal_conv, right_conv

B, C, K = 2, 6, 4
ATOL = 1e-6


def loop_causal(x, context, w):
    """out_i = Σ_{k=0..K-1} w[:, k] · x_{i-(K-1)+k}, reading `context` before position 0."""
    full = torch.cat((context, x), -1)
    kk = w.shape[-1]
    out = torch.zeros_like(x)
    for i in range(x.shape[-1]):
        for k in range(kk):
            out[..., i] += w[:, k] * full[..., i + k]
    return out


def loop_right(x, w):
    """out_i = Σ_{k=1..K} w[:, k-1] · x_{i+k}, zero past the end."""
    length = x.shape[-1]
    out = torch.zeros_like(x)
    for i in range(length):
        for k in range(1, w.shape[-1] + 1):
            if i + k < length:
                out[..., i] += w[:, k - 1] * x[..., i + k]
    return out


def inputs(length: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(B, C, length, generator=gen), torch.randn(B, C, K - 1, generator=gen),
            torch.randn(C, K, generator=gen), torch.randn(C, K, generator=gen))


def test_causal_conv_matches_loop():
    for length in (1, 3, 9):
        x, context, w, _ = inputs(length)
        torch.testing.assert_close(causal_conv(x, context, w), loop_causal(x, context, w), rtol=0, atol=ATOL)


def test_right_conv_matches_loop():
    for length in (1, 2, 4, 5, 32):  # shorter than, equal to and longer than the kernel
        x, _, _, w = inputs(length, seed=length)
        torch.testing.assert_close(right_conv(x, w), loop_right(x, w), rtol=0, atol=ATOL)


def test_block_conv_with_zero_right_branch_is_the_causal_conv():
    """Given the same context, block mode with zero right weights is the causal conv on the block,
    i.e. the conv outputs the causal pass computes for those positions over prefix + block."""
    prefix, _, w, _ = inputs(7, seed=1)
    block, _, _, _ = inputs(5, seed=2)
    zero_context = torch.zeros(B, C, K - 1)
    whole = causal_conv(torch.cat((prefix, block), -1), zero_context, w)
    context = prefix[..., -(K - 1):]
    out = block_conv(block, context, w, torch.zeros(C, K))
    torch.testing.assert_close(out, causal_conv(block, context, w), rtol=0, atol=ATOL)
    torch.testing.assert_close(out, whole[..., -5:], rtol=0, atol=ATOL)


def test_block_conv_adds_the_right_branch():
    for length in (1, 3, 8, 32):
        x, context, w_left, w_right = inputs(length, seed=3)
        expected = loop_causal(x, context, w_left) + loop_right(x, w_right)
        out = block_conv(x, context, w_left, w_right)
        torch.testing.assert_close(out, expected, rtol=0, atol=ATOL)
        twin = causal_conv(x, context, w_left) + right_conv(x, w_right)  # the two-call form
        torch.testing.assert_close(out, twin, rtol=0, atol=ATOL)


def test_right_branch_sees_only_later_positions_inside_the_block():
    x, _, _, w = inputs(6, seed=4)
    out = right_conv(x, w)
    assert torch.equal(out[..., -1], torch.zeros(B, C))  # nothing after the last block position
    torch.testing.assert_close(out[..., -2], w[:, 0] * x[..., -1], rtol=0, atol=ATOL)
    poked = x.clone()
    poked[..., 3] += 1.0  # x_3 feeds positions max(0, 3-K) .. 2 only
    changed = (right_conv(poked, w) - out).abs().amax((0, 1)) > 0
    assert changed.tolist() == [True, True, True, False, False, False]
