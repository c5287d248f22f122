"""Block expansion (clover/training/grow.py): the grown model computes exactly what its init computes,
in causal and block mode, and training reaches the inserted copies."""

import pytest
import torch
from tiny import TINY_MASK, random_ids, tiny_model

from clover.training.grow import grow_layers, grown_config, layer_sources


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


def test_grown_model_computes_what_the_init_computes(pair):
    model, grown = pair
    seq = random_ids(2, 19)
    seq[:, -8:][:, ::2] = TINY_MASK
    with torch.no_grad():
        for block_len in (0, 8):
            torch.testing.assert_close(grown(seq, block_len=block_len).logits,
                                       model(seq, block_len=block_len).logits, rtol=0, atol=1e-6)


def test_training_reaches_the_copies():
    grown = grow_layers(tiny_model(seed=3), [3])
    seq = random_ids(2, 24, seed=1)
    logits = grown(seq[:, :-1]).logits
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), seq[:, 1:].flatten()).backward()
    copy = grown.model.layers[4]
    for writes in (copy.self_attn.o_proj.weight, copy.mlp.shared_expert.down_proj.weight):
        assert writes.grad.abs().sum() > 0  # the zeroed projections learn first


def test_bad_indices_are_refused_by_value():
    with pytest.raises(ValueError, match=r"\[4\] outside 0..3"):
        layer_sources(4, [1, 4])
    with pytest.raises(ValueError, match="twice"):
        grown_config(tiny_model().config, [1, 1])
    assert grow_layers(model := tiny_model(), []) is model
