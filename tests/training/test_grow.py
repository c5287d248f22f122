"""Growth (clover/training/grow.py), by block expansion, attention heads or expert units: the grown model computes
exactly what its init computes, in causal and block mode, and training reaches what was added."""

import pytest
import torch
from tiny import TINY_MASK, random_ids, tiny_model

from clover.training.grow import (conv_widened_config, experts_widened_config, grow_conv, grow_experts, grow_heads,
                                  grow_layers, grown_config, layer_sources, new_conv_scales, new_expert_scales,
                                  new_head_scales, widened_config)


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


@pytest.fixture(scope="module")
def experts():
    model = tiny_model(seed=3)
    return model, grow_experts(model, 8, 16)  # routed experts 32 -> 40 units, shared expert 32 -> 48


@pytest.fixture(scope="module")
def conv():
    model = tiny_model(seed=3)  # random right taps too: block mode reads both branches
    return model, grow_conv(model, 8)  # 4 -> 8 causal and right taps per GDN channel


@pytest.mark.parametrize("grown_pair", ["pair", "widened", "split", "experts", "conv"])
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


def test_widened_experts_keep_the_old_units_and_silence_the_new(experts):
    model, wide = experts
    units, shared = model.config.moe_intermediate_size, model.config.shared_expert_intermediate_size
    assert (wide.config.moe_intermediate_size, wide.config.shared_expert_intermediate_size) == (units + 8, shared + 16)
    old, new = model.model.layers[1].mlp, wide.model.layers[1].mlp
    gate, up = old.experts.gate_up_proj.chunk(2, dim=1)  # [E, I, H] each
    wide_gate, wide_up = new.experts.gate_up_proj.chunk(2, dim=1)
    assert torch.equal(wide_gate[:, :units], gate) and torch.equal(wide_up[:, :units], up)
    assert wide_gate[:, units:].std() > 0 and wide_up[:, units:].std() > 0  # fresh: they can learn
    assert torch.equal(new.experts.down_proj[..., :units], old.experts.down_proj)
    assert torch.count_nonzero(new.experts.down_proj[..., units:]) == 0
    for proj in ("gate_proj", "up_proj"):
        assert torch.equal(getattr(new.shared_expert, proj).weight[:shared], getattr(old.shared_expert, proj).weight)
    assert torch.count_nonzero(new.shared_expert.down_proj.weight[:, shared:]) == 0
    assert torch.equal(new.gate.weight, old.gate.weight)  # routing is unchanged
    again = grow_experts(model, 8, 16)  # a fixed seed: sibling runs share the new units
    assert torch.equal(again.model.layers[1].mlp.experts.gate_up_proj, new.experts.gate_up_proj)


def test_training_reaches_the_new_units():
    wide = backward_once(grow_experts(tiny_model(seed=3), 8, 16))
    units = wide.config.moe_intermediate_size - 8
    mlp = wide.model.layers[3].mlp
    assert mlp.experts.down_proj.grad[..., units:].abs().sum() > 0
    assert mlp.shared_expert.down_proj.weight.grad[:, -16:].abs().sum() > 0


def test_new_expert_scales_mark_exactly_the_new_units(experts):
    _, wide = experts
    scales = new_expert_scales(wide, 8, 16, 10.0)
    assert sorted({name.split(".mlp.")[1] for name in scales}) == [
        "experts.down_proj", "experts.gate_up_proj", "shared_expert.down_proj.weight",
        "shared_expert.gate_proj.weight", "shared_expert.up_proj.weight"]
    units = wide.config.moe_intermediate_size
    gate_up = scales["model.layers.0.mlp.experts.gate_up_proj"]  # [E, 2I, H]: new rows end each half
    rows = torch.tensor([1.0] * (units - 8) + [10.0] * 8).repeat(2)
    assert torch.equal(gate_up, rows[None, :, None].expand_as(gate_up))
    down = scales["model.layers.0.mlp.experts.down_proj"]
    assert torch.equal(down[..., :-8], torch.ones_like(down[..., :-8])) and (down[..., -8:] == 10).all()
    assert (scales["model.layers.0.mlp.shared_expert.gate_proj.weight"][-16:] == 10).all()


def test_bad_expert_units_are_refused_by_value():
    with pytest.raises(ValueError, match="grow_experts=-1, grow_shared_expert=0: extra hidden units must be >= 0"):
        experts_widened_config(tiny_model().config, -1, 0)
    assert grow_experts(model := tiny_model(), 0, 0) is model


def test_a_run_scales_each_grown_part_at_its_own_rate():
    from clover.training.recipe import ModelRecipe
    from clover.training.run import grown_part_scales

    wide = grow_experts(grow_heads(tiny_model(seed=3), 4), 8, 16)
    both = ModelRecipe(init="x", grow_heads=4, grow_heads_lr=5.0, grow_experts=8, grow_shared_expert=16,
                       grow_experts_lr=10.0)
    scales = grown_part_scales(wide, both)
    assert scales["model.layers.3.self_attn.o_proj.weight"].max() == 5
    assert scales["model.layers.3.mlp.experts.down_proj"].max() == 10
    assert grown_part_scales(wide, ModelRecipe(init="x", grow_heads=4, grow_experts=8)) is None


def test_widened_conv_keeps_the_old_taps_next_to_the_token_and_zeros_the_new(conv):
    """The causal taps end at the current token, so the old ones are the last four; block mode's
    right taps start at the next token, so the old ones are the first four."""
    model, wide = conv
    assert (model.config.linear_conv_kernel_dim, wide.config.linear_conv_kernel_dim) == (4, 8)
    old, new = model.model.layers[0].linear_attn, wide.model.layers[0].linear_attn
    assert new.conv1d.weight.shape[-1] == 8 and new.conv_right_weight.shape[-1] == 8
    assert torch.equal(new.conv1d.weight[..., 4:], old.conv1d.weight)
    assert torch.count_nonzero(new.conv1d.weight[..., :4]) == 0
    assert torch.equal(new.conv_right_weight[:, :4], old.conv_right_weight)
    assert torch.count_nonzero(new.conv_right_weight[:, 4:]) == 0
    for name, param in model.named_parameters():
        if "conv" not in name:
            assert torch.equal(wide.get_parameter(name), param), name


def test_widened_conv_decodes_what_the_init_decodes(conv):
    """Block diffusion through the cache (whose conv state holds the last K-1 inputs) writes the
    same tokens with eight taps as with the init's four."""
    model, wide = conv
    ids = random_ids(1, 11, seed=4)
    settings = dict(block_size=8, max_new_tokens=24, eos_token_id=[])
    assert torch.equal(wide.generate(ids, **settings), model.generate(ids, **settings))


def test_new_conv_scales_mark_exactly_the_new_taps(conv):
    _, wide = conv
    scales = new_conv_scales(wide, 4, 10.0)
    assert sorted({name.split(".linear_attn.")[1] for name in scales}) == ["conv1d.weight", "conv_right_weight"]
    gdn = "model.layers.0.linear_attn"
    causal, right = scales[f"{gdn}.conv1d.weight"], scales[f"{gdn}.conv_right_weight"]
    assert (causal[..., :4] == 10).all() and (causal[..., 4:] == 1).all()
    assert (right[:, :4] == 1).all() and (right[:, 4:] == 10).all()
    with pytest.raises(ValueError, match="grow_conv_lr=10.0 needs grow_conv_kernel"):
        from clover.training.recipe import ModelRecipe

        ModelRecipe(init="x", grow_conv_lr=10.0)


def test_training_reaches_the_new_taps():
    wide = backward_once(grow_conv(tiny_model(seed=3), 8))
    assert wide.model.layers[0].linear_attn.conv1d.weight.grad[..., :4].abs().sum() > 0


def test_bad_conv_kernels_are_refused_by_value():
    with pytest.raises(ValueError, match="grow_conv_kernel=3 must be 0 .* linear_conv_kernel_dim=4"):
        conv_widened_config(tiny_model().config, 3)
    assert grow_conv(model := tiny_model(), 0) is model and grow_conv(model, 4) is model
    from clover.training.recipe import ModelRecipe

    with pytest.raises(ValueError, match="grow_conv_kernel=8 needs `init`"):
        ModelRecipe(config={"hidden_size": 32}, grow_conv_kernel=8)
