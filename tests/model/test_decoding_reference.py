"""`generate` (cached, batched machinery) against the uncached naive decoders, greedy."""

import pytest
import torch

from clover.model.generation_batch import StepEvent
from decoding_reference import naive_autoregressive, naive_block_diffusion
from decoding_helpers import CONTROLS_OFF, CONTROLS_ON, EOS, one_thread, peaked_model, prompt  # noqa: F401


@pytest.fixture(scope="module")
def model():
    return peaked_model()


@pytest.mark.parametrize("controls", [CONTROLS_OFF, CONTROLS_ON], ids=["off", "on"])
@pytest.mark.parametrize("threshold", [0.3, 0.9, 1.0])
@pytest.mark.parametrize("block_size", [4, 8, 32])
def test_block_diffusion_matches_naive(model, block_size, threshold, controls):
    ids = prompt(9, seed=block_size, think=True)
    s = dict(controls, block_size=block_size, threshold=threshold, max_new_tokens=22,
             eos_token_id=[EOS])
    expected = naive_block_diffusion(model, ids, s)
    out = model.generate(torch.tensor([ids]), do_sample=False, return_dict_in_generate=True, **s)
    assert out.sequences[0, len(ids):].tolist() == expected
    assert out.rows[0].new_tokens == len(expected)


def test_threshold_one_fills_one_position_per_step(model):
    ids = torch.tensor([prompt(7)])
    steps = [e for e in model.stream_generate(ids, block_size=8, threshold=1.0, max_new_tokens=16,
                                              eos_token_id=[], **CONTROLS_OFF)
             if isinstance(e, StepEvent)]
    assert len(steps) == 16
    assert all(int(e.filled.sum()) == 1 for e in steps)


@pytest.mark.parametrize("controls", [CONTROLS_OFF, CONTROLS_ON], ids=["off", "on"])
def test_autoregressive_matches_naive(model, controls):
    ids = prompt(6, seed=3, think=True)
    s = dict(controls, max_new_tokens=12, eos_token_id=[EOS])
    expected = naive_autoregressive(model, ids, s)
    out = model.generate(torch.tensor([ids]), mode="ar", return_dict_in_generate=True, **s)
    assert out.sequences[0, len(ids):].tolist() == expected
    assert out.num_forward_passes == len(expected)


@pytest.mark.parametrize("threshold", [0.5, 1.0])
@pytest.mark.parametrize("block_size", [4, 8])
def test_naive_match_when_thinking_closes_and_eos_stops(model, block_size, threshold):
    """Think-end and EOS ids taken from tokens the model does produce, so thinking closes inside a
    block (the bias stops) and an EOS ends the response early."""
    ids = prompt(7, seed=11)
    base = dict(CONTROLS_ON, block_size=block_size, threshold=threshold, max_new_tokens=30)
    free = model.generate(torch.tensor([ids]), **dict(base, eos_token_id=[], dllm_think_end_bias=0.0)
                          )[0, len(ids):].tolist()
    think_end, eos = free[2], next(t for t in free[12:] if t not in free[:12])
    s = dict(base, think_start_token_id=ids[0], think_end_token_id=think_end, eos_token_id=[eos, 126],
             dllm_think_end_start=0, dllm_think_end_window=3)
    expected = naive_block_diffusion(model, ids, s)
    got = model.generate(torch.tensor([ids]), **s)[0, len(ids):].tolist()
    assert got == expected
    assert think_end in expected  # thinking closed
    assert len(expected) < 30 and expected[-1] == eos  # stopped by the EOS
