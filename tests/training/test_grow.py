"""Growth (clover/training/grow.py), by block expansion or by attention heads: the grown model computes
exactly what its init computes, in causal and block mode, and training reaches what was added."""

import pytest
import torch
from tiny import TINY_MASK, random_ids, tiny_model

from clover.training.grow import (grow_heads, grow_layers, grown_config, layer_sources, new_head_scales,
                                  widened_config)


@pytest.fixture(scope="module")
def pair():
    model = tiny_model(seed=3)
    return model, grow_layers(model, [2, 3])  # GDN, GDN, GDN, GDN', attention, attention'


def test_grown_layout_copies_the_named_layers(pair):
    model, grown = pair
    assert grown.config.num_hidden_layers == 6
    assert grown.config.layer_types == [model.config.layer_types[i] for i in (0, 1, 2, 2, 3, 3)]
    state = grown.state_dict()
    for key, value in model.model.layers[3].state_dict().items():
        assert torch.equal(state[f"model.layers.4.{key}"], value)  # the original
        copied = state[f"model.layers.5.{key}"]  # its copy: equal but for the residual writes
        silent = key in ("self_attn.o_proj.weight", "mlp.experts.down_proj", "mlp.shared_expert.down_proj.weight")
        assert torch.equal(copied, torch.zeros_like(value) if silent else value), key
    assert torch.equal(state["model.layers.2.linear_attn.out_proj.weight"],
                       model.model.layers[2].linear_attn.out_proj.weight)
    assert torch.count_nonzero(state["model.layers.3.linear_attn.out_proj.weight"]) == 0


@pytest.fixture(scope="module")
def widened():
    model = tiny_model(seed=3)
    return model, grow_heads(model, 4)  # 4 + 4 query heads on 2 + 2 key-value heads


@pytest.fixture(scope="module")
def split():
    model = tiny_model(seed=3)
    return model, grow_heads(model, 4, split=True, noise=0.0)  # heads 4..7 copy heads 0..3, unmoved


@pytest.mark.parametrize("grown_pair", ["pair", "widened", "split"])
def test_grown_model_computes_what_the_init_computes(grown_pair, request):
    model, grown = request.getfixturevalue(grown_pair)
    seq = random_ids(2, 19)
    seq[:, -8:][:, ::2] = TINY_MASK
    atol = 3e-6 if grown_pair == "split" else 1e-6  # a split head's write is two halves summed in fp32
    with torch.no_grad():
        for block_len in (0, 8):
            torch.testing.assert_close(grown(seq, block_len=block_len).logits,
                                       model(seq, block_len=block_len).logits, rtol=0, atol=atol)


def backward_once(model):
    """`model` after one next-token loss's backward pass on random ids (its grads filled)."""
    seq = random_ids(2, 24, seed=1)
    logits = model(seq[:, :-1]).logits
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), seq[:, 1:].flatten()).backward()
    return model


def test_training_reaches_the_copies():
    grown = backward_once(grow_layers(tiny_model(seed=3), [3]))
    copy = grown.model.layers[4]
    for writes in (copy.self_attn.o_proj.weight, copy.mlp.shared_expert.down_proj.weight):
        assert writes.grad.abs().sum() > 0  # the zeroed projections learn first


def test_widened_layout_keeps_the_old_heads_and_silences_the_new(widened):
    model, wide = widened
    assert (wide.config.num_attention_heads, wide.config.num_key_value_heads) == (8, 4)
    old, new = model.model.layers[3].self_attn, wide.model.layers[3].self_attn
    dim = model.config.head_dim
    assert torch.equal(new.q_proj.weight[:4 * 2 * dim], old.q_proj.weight)
    assert torch.equal(new.k_proj.weight[:2 * dim], old.k_proj.weight)
    assert torch.equal(new.o_proj.weight[:, :4 * dim], old.o_proj.weight)
    assert torch.count_nonzero(new.o_proj.weight[:, 4 * dim:]) == 0
    assert new.q_proj.weight[4 * 2 * dim:].std() > 0  # fresh, not zero: they can learn
    assert torch.equal(wide.model.layers[0].linear_attn.out_proj.weight,
                       model.model.layers[0].linear_attn.out_proj.weight)
    again = grow_heads(model, 4)  # a fixed seed: sibling runs share the new heads
    assert torch.equal(again.model.layers[3].self_attn.q_proj.weight, new.q_proj.weight)


def test_training_reaches_the_new_heads():
    wide = backward_once(grow_heads(tiny_model(seed=3), 4))
    o_proj = wide.model.layers[3].self_attn.o_proj.weight
    assert o_proj.grad[:, 4 * wide.config.head_dim:].abs().sum() > 0


def test_split_heads_copy_the_old_heads_and_share_their_writes():
    model = tiny_model(seed=3)
    wide = grow_heads(model, 2, split=True)  # heads 4, 5 copy heads 0, 1 (key-value head 2 copies 0)
    old, new = model.model.layers[3].self_attn, wide.model.layers[3].self_attn
    dim = model.config.head_dim
    q_old, q_new = (a.q_proj.weight.view(a.num_heads, 2, dim, -1) for a in (old, new))
    delta = q_new[:2, 0] - q_old[:2, 0]
    assert delta.abs().min() > 0  # the pair's query rows move apart ...
    torch.testing.assert_close(q_new[4:, 0], q_old[:2, 0] - delta, rtol=0, atol=1e-7)  # ... by -delta
    assert torch.equal(q_new[4:, 1], q_old[:2, 1]) and torch.equal(q_new[:2, 1], q_old[:2, 1])  # gates: copied
    assert torch.equal(q_new[2:4], q_old[2:4])  # heads without a copy keep their rows
    for proj in ("k_proj", "v_proj"):
        rows = getattr(new, proj).weight.view(3, dim, -1)
        assert torch.equal(rows[2], rows[0]) and torch.equal(rows[:2], getattr(old, proj).weight.view(2, dim, -1))
    o_old, o_new = (a.o_proj.weight.view(-1, a.num_heads, dim) for a in (old, new))
    assert torch.equal(o_new[:, :2], o_old[:, :2] / 2) and torch.equal(o_new[:, 4:], o_new[:, :2])
    assert torch.equal(o_new[:, 2:4], o_old[:, 2:4])


def test_split_heads_move_the_output_by_the_second_order_of_their_noise():
    model, seq = tiny_model(seed=3), random_ids(2, 24, seed=1)
    with torch.no_grad():
        base = model(seq).logits
        moved = [(grow_heads(model, 4, split=True, noise=noise)(seq).logits - base).abs().max()
                 for noise in (0.01, 0.02)]
    assert 3.5 < moved[1] / moved[0] < 4.5  # twice the noise, four times the change: +delta and -delta cancel


def test_split_heads_learn_apart():
    wide = backward_once(grow_heads(tiny_model(seed=3), 4, split=True))
    grad = wide.model.layers[3].self_attn.o_proj.weight.grad.view(-1, 8, wide.config.head_dim)
    assert (grad[:, 4:] - grad[:, :4]).abs().max() > 1e-3 * grad.abs().max()  # each copy learns its own


def test_bad_indices_are_refused_by_value():
    with pytest.raises(ValueError, match=r"\[4\] outside 0..3"):
        layer_sources(4, [1, 4])
    with pytest.raises(ValueError, match="twice"):
        grown_config(tiny_model().config, [1, 1])
    assert grow_layers(model := tiny_model(), []) is model
    with pytest.raises(ValueError, match="grow_heads=3 must be a non-negative multiple of the 2"):
        widened_config(tiny_model().config, 3)
    assert grow_heads(model, 0) is model
    with pytest.raises(ValueError, match="grow_heads=6 split from 4 heads: .* at most 4"):
        grow_heads(model, 6, split=True)


def test_new_head_scales_cover_the_new_heads_alone(widened):
    _, wide = widened  # 4 + 4 query heads on 2 + 2 key-value heads
    scales = new_head_scales(wide, 4, 10.0)
    dim = wide.config.head_dim
    assert sorted(scales) == sorted(f"model.layers.3.self_attn.{p}_proj.weight" for p in "qkvo")
    new_rows = {"q": slice(4 * 2 * dim, None), "k": slice(2 * dim, None), "v": slice(2 * dim, None)}
    for p, rows in new_rows.items():
        scale = scales[f"model.layers.3.self_attn.{p}_proj.weight"]
        expected = torch.ones_like(scale)
        expected[rows] = 10.0
        assert torch.equal(scale, expected), p
    o_scale = torch.ones(wide.config.hidden_size, 8 * dim)
    o_scale[:, 4 * dim:] = 10.0
    assert torch.equal(scales["model.layers.3.self_attn.o_proj.weight"], o_scale)
