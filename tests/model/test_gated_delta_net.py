"""The Gated DeltaNet layer in block mode against the SPEC §3.2 algebra written as loops (fp32,
atol 1e-5), with a prefix state and with an empty prefix."""

import math

import torch
import torch.nn.functional as F

from clover.model.cache import GatedDeltaNetLayerCache
from clover.model.gated_delta_net import GatedDeltaNet, causal_conv
from tiny import tiny_config


def layer(seed: int = 0) -> GatedDeltaNet:
    torch.manual_seed(seed)
    gdn = GatedDeltaNet(tiny_config())
    with torch.no_grad():
        for name, p in gdn.named_parameters():
            if name not in ("A_log", "dt_bias"):
                p.normal_(0, 0.3)
        gdn.logit_scale.fill_(2.5)
        gdn.history_bias.fill_(0.4)
        gdn.history_c.fill_(0.7)
    return gdn


def spec_block(gdn: GatedDeltaNet, x: torch.Tensor, context: torch.Tensor, state: torch.Tensor):
    """SPEC §3.2 steps 1-4 for one batch of blocks, one position and one head at a time."""
    bsz, length, _ = x.shape
    kk, dk, dv = gdn.kernel, gdn.head_k_dim, gdn.head_v_dim
    xc = gdn.in_proj_qkv(x).transpose(1, 2)  # [B, C, L]
    full = torch.cat((context, xc), -1)  # context occupies offsets -(K-1)..-1
    left_w, right_w = gdn.conv1d.weight[:, 0], gdn.conv_right_weight
    u = torch.zeros_like(xc)
    for i in range(length):
        u[..., i] = (left_w * full[..., i:i + kk]).sum(-1)
        for k in range(1, kk + 1):
            if i + k < length:
                u[..., i] += right_w[:, k - 1] * xc[..., i + k]
    u = F.silu(u).transpose(1, 2)  # [B, L, C]
    q, k, v = u.split((gdn.key_dim, gdn.key_dim, gdn.value_dim), -1)
    q = F.normalize(q.reshape(bsz, length, gdn.num_k_heads, dk), dim=-1, eps=0)
    k = F.normalize(k.reshape(bsz, length, gdn.num_k_heads, dk), dim=-1, eps=0)
    v = v.reshape(bsz, length, gdn.num_v_heads, dv)
    groups = gdn.num_v_heads // gdn.num_k_heads
    out = torch.zeros(bsz, length, gdn.num_v_heads, dv)
    for b in range(bsz):
        for h in range(gdn.num_v_heads):
            kh = h // groups  # value head h reads key head h // groups
            for i in range(length):
                history = state[b, h].T @ (q[b, i, kh] * dk ** -0.5)
                s0 = gdn.history_bias + gdn.history_c * math.log(length)
                s = gdn.logit_scale * (k[b, :, kh] @ q[b, i, kh])
                p = torch.cat((s0.view(1), s)).softmax(0)
                out[b, i, h] = p[0] * history + p[1:] @ v[b, :, h]
    z = gdn.in_proj_z(x).reshape(-1, dv)
    normed = gdn.norm(out.reshape(-1, dv), z)
    return gdn.out_proj(normed.reshape(bsz, length, -1))


def test_block_mode_matches_the_spec_algebra_after_a_prefix():
    gdn = layer()
    prefix, block = torch.randn(2, 7, 32), torch.randn(2, 5, 32)
    cache = GatedDeltaNetLayerCache()
    real = torch.ones(2, 12, dtype=torch.bool)
    with torch.no_grad():
        gdn(prefix, real[:, :7], cache, block_len=0)
        out = gdn(block, real[:, 7:], cache, block_len=5)
        expected = spec_block(gdn, block, cache.conv_state, cache.recurrent_state)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)


def test_block_mode_with_an_empty_prefix_reads_zero_state_and_context():
    gdn = layer(1)
    block = torch.randn(2, 8, 32)
    real = torch.ones(2, 8, dtype=torch.bool)
    cache = GatedDeltaNetLayerCache()
    with torch.no_grad():
        no_cache = gdn(block, real, None, block_len=8)
        empty = gdn(block, real, cache, block_len=8)
        expected = spec_block(gdn, block, torch.zeros(2, gdn.conv_dim, 3), torch.zeros(2, 4, 8, 8))
    torch.testing.assert_close(no_cache, expected, rtol=0, atol=1e-5)
    assert torch.equal(no_cache, empty)
    assert cache.conv_state is None and cache.recurrent_state is None


def test_uncached_prefix_plus_block_equals_cached():
    gdn = layer(2)
    x = torch.randn(1, 12, 32)
    real = torch.ones(1, 12, dtype=torch.bool)
    cache = GatedDeltaNetLayerCache()
    with torch.no_grad():
        whole = gdn(x, real, None, block_len=4)
        gdn(x[:, :8], real[:, :8], cache, block_len=0)
        block = gdn(x[:, 8:], real[:, 8:], cache, block_len=4)
    torch.testing.assert_close(block, whole[:, 8:], rtol=0, atol=1e-5)


def test_causal_conv_state_is_the_last_inputs():
    gdn = layer(3)
    x = torch.randn(1, 6, 32)
    cache = GatedDeltaNetLayerCache()
    with torch.no_grad():
        gdn(x, torch.ones(1, 6, dtype=torch.bool), cache, block_len=0)
        xc = gdn.in_proj_qkv(x).transpose(1, 2)
    assert torch.equal(cache.conv_state, xc[..., -3:])
    assert cache.conv_state.is_contiguous()  # a copy, not a view pinning the whole prefill
    assert causal_conv(xc, torch.zeros(1, gdn.conv_dim, 3), gdn.conv1d.weight[:, 0]).shape == xc.shape


def test_recurrent_conv_step_equals_the_conv():
    """The one-token path (a dot over the K taps) against F.conv1d, its twin: fp32 to 1e-6, bf16
    within one bf16 rounding of the output."""
    gdn = layer(4)
    weight = gdn.conv1d.weight[:, 0].detach()
    window = torch.randn(2, gdn.conv_dim, gdn.kernel)
    for dtype, atol in ((torch.float32, 1e-6), (torch.bfloat16, 2e-2)):
        w, full = weight.to(dtype), window.to(dtype)
        one = causal_conv(full[..., -1:], full[..., :-1], w)  # T = 1: the recurrent step
        conv = F.conv1d(full, w.unsqueeze(1), groups=gdn.conv_dim)
        torch.testing.assert_close(one.float(), conv.float(), rtol=0, atol=atol)
