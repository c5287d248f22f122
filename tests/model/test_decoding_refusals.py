"""Requests refused before any compute, each with a message that names the value and the limit."""

import pytest
import torch

from clover.model.generation import stream_generate
from decoding_helpers import one_thread  # noqa: F401
from scripted_model import ScriptedModel

PROMPT = torch.tensor([[10, 11, 12]])


@pytest.fixture
def model():
    return ScriptedModel(3, {}, max_position_embeddings=100)


@pytest.mark.parametrize("kwargs, message", [
    (dict(block_size=3), "block_size=3 is invalid: must divide 32"),
    (dict(block_size=64), "block_size=64 is invalid: must divide 32"),
    (dict(block_size=0), "block_size=0 is invalid"),
    (dict(threshold=0.0), "threshold=0.0 is invalid: must be in (0, 1]"),
    (dict(threshold=1.5), "threshold=1.5 is invalid: must be in (0, 1]"),
    (dict(max_new_tokens=0), "max_new_tokens=0 is invalid: must be a positive integer"),
    (dict(max_new_tokens=-4), "max_new_tokens=-4 is invalid"),
    (dict(do_sample=True, temperature=0.0), "temperature=0.0 is invalid"),
    (dict(top_p=0.0), "top_p=0.0 is invalid"),
    (dict(top_k=-1), "top_k=-1 is invalid"),
    (dict(eos_token_id=[500]), "eos_token_id=500 is invalid: must be in [0, vocab_size=128)"),
    (dict(mode="beam"), "mode='beam' is invalid"),
    (dict(num_beams=4), "unknown generation argument(s) ['num_beams']"),
])
def test_bad_settings(model, kwargs, message):
    with pytest.raises(ValueError) as e:
        model_generate(model, PROMPT, **kwargs)
    assert message in str(e.value)
    assert model.calls == []


def model_generate(model, ids, **kwargs):
    return stream_generate(model, ids, **kwargs)


def test_context_overflow_states_the_three_numbers(model):
    ids = torch.randint(10, 100, (1, 40))
    with pytest.raises(ValueError) as e:
        model_generate(model, ids, block_size=32, max_new_tokens=33)
    message = str(e.value)
    assert "prompt length 40" in message and "64 generated positions" in message
    assert "max_position_embeddings=100" in message
    model_generate(model, ids, block_size=4, max_new_tokens=60)  # 40 + 60 fits exactly
    with pytest.raises(ValueError, match="max_position_embeddings=100"):
        model_generate(model, ids, block_size=8, max_new_tokens=57)  # 57 -> 64 positions
    assert model.calls == []


@pytest.mark.parametrize("ids, mask, message", [
    (torch.zeros(1, 0, dtype=torch.long), None, "empty prompt"),
    (torch.tensor([[1, 2]]), torch.tensor([[0, 0]]), "empty prompt: row 0"),
    (torch.tensor([[1, 200, 3]]), None, "token id 200 is outside the vocabulary [0, vocab_size=128)"),
    (torch.tensor([[1, -2, 3]]), None, "token id -2 is outside the vocabulary"),
    (torch.tensor([[1, 127, 3]]), None, "the prompt contains mask_token_id=127"),
    (torch.tensor([[1, 2, 3]]), torch.tensor([[1, 1, 0]]), "prompts must be left-padded"),
])
def test_bad_prompts(model, ids, mask, message):
    with pytest.raises(ValueError) as e:
        model_generate(model, ids, attention_mask=mask)
    assert message in str(e.value)
    assert model.calls == []


def test_padding_may_hold_any_id(model):
    ids, mask = torch.tensor([[127, 10, 11]]), torch.tensor([[0, 1, 1]])
    model_generate(model, ids, attention_mask=mask, max_new_tokens=2)
