"""Each control against its SPEC §6 formula on hand-made logits; confidence under sampling."""

import math

import torch

from clover.model.generation_sampling import filter_top_k, filter_top_p, predict_with_confidence
from clover.model.generation_sampling import (ControlContext, FrequencyPresencePenalty, LengthPenalty,
                                   RepetitionPenalty, ThinkEndBias, last_marker_state,
                                   slot_think_open, think_markers, token_counts)
from decoding_helpers import one_thread  # noqa: F401

V = 6
LOGITS = torch.tensor([[[2.0, -1.0, 0.5, -3.0, 1.0, 0.0],
                        [-2.0, 4.0, -0.5, 3.0, 0.0, 1.0]]])  # [N=1, L=2, V]


def context(history: list[int], positions=(0, 1), think_open=None) -> ControlContext:
    counts = torch.zeros(1, V)
    for t in history:
        counts[0, t] += 1
    return ControlContext(counts, torch.tensor(positions), think_open)


def test_repetition_penalty():
    out = RepetitionPenalty(2.0)(LOGITS, context([0, 1, 1]))
    expected = LOGITS.clone()
    for t in (0, 1):
        expected[..., t] = torch.where(LOGITS[..., t] > 0, LOGITS[..., t] / 2, LOGITS[..., t] * 2)
    assert torch.equal(out, expected)
    assert torch.equal(out[..., 2:], LOGITS[..., 2:])


def test_frequency_and_presence_penalty():
    out = FrequencyPresencePenalty(0.5, 0.25)(LOGITS, context([3, 3, 3, 4]))
    expected = LOGITS.clone()
    expected[..., 3] -= 0.5 * 3 + 0.25
    expected[..., 4] -= 0.5 * 1 + 0.25
    assert torch.allclose(out, expected)


def test_length_penalty_ramps_on_every_eos():
    out = LengthPenalty(10.0, start=4, window=8, eos_ids=(2, 5))(LOGITS, context([], positions=(6, 20)))
    expected = LOGITS.clone()
    expected[0, 0, [2, 5]] += 10.0 * (6 - 4) / 8
    expected[0, 1, [2, 5]] += 10.0  # clamped to 1
    assert torch.allclose(out, expected)
    before = LengthPenalty(10.0, start=30, window=8, eos_ids=(2,))(LOGITS, context([], positions=(6, 20)))
    assert torch.equal(before, LOGITS)


def test_think_end_bias_only_while_thinking():
    open_ = torch.tensor([[True, False]])
    out = ThinkEndBias(4.0, start=0, window=10, think_end_id=1)(LOGITS, context([], (5, 5), open_))
    assert math.isclose(float(out[0, 0, 1] - LOGITS[0, 0, 1]), 4.0 * 0.5, rel_tol=1e-6)
    assert torch.equal(out[0, 1], LOGITS[0, 1])
    assert torch.equal(out[..., [0, 2, 3, 4, 5]], LOGITS[..., [0, 2, 3, 4, 5]])


def test_thinking_state_over_a_block():
    start, end, mask = 3, 4, 9
    block = torch.tensor([[7, start, mask, end, 7, mask], [end, 7, 7, start, 7, 7]])
    markers = think_markers(block, block != mask, start, end)
    before = torch.tensor([False, True])
    # slot j sees only filled positions < j; the prefix state decides until a marker appears
    assert slot_think_open(markers, before).tolist() == [
        [False, False, True, True, False, False],
        [True, False, False, False, True, True]]
    assert last_marker_state(markers, before).tolist() == [False, True]
    prompt = torch.tensor([[start, 7, end, start, 7]])
    prompt_markers = think_markers(prompt, torch.ones_like(prompt, dtype=torch.bool), start, end)
    assert last_marker_state(prompt_markers, torch.tensor([False])).tolist() == [True]


def test_token_counts_scatter():
    tokens = torch.tensor([[1, 1, 4, 0], [2, 3, 3, 3]])
    weights = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 1]])
    assert token_counts(tokens, weights, V).tolist() == [[0, 2, 0, 0, 1, 0], [0, 0, 1, 2, 0, 0]]


def test_top_k_top_p_filters():
    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0]])
    assert torch.isinf(filter_top_k(logits, 2)).tolist() == [[False, True, False, True]]
    probs = logits.softmax(-1)[0].tolist()  # ≈ .64 .09 .24 .03
    assert torch.isinf(filter_top_p(logits, 0.5)).tolist() == [[False, True, True, True]]
    assert torch.isinf(filter_top_p(logits, probs[0] + 0.01)).tolist() == [[False, True, False, True]]
    assert torch.isinf(filter_top_p(logits, 1.0)).sum() == 0


def test_sampling_settings_never_change_confidence():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 50) * 3
    reference = logits.softmax(-1)
    for settings in [dict(top_k=1), dict(top_k=5), dict(top_p=0.3), dict(top_p=0.9, temperature=0.2),
                     dict(temperature=3.0), dict(top_k=3, top_p=0.5, temperature=0.7)]:
        g = torch.Generator().manual_seed(1)
        tokens, confidence = predict_with_confidence(logits, do_sample=True, generator=g, **settings)
        assert torch.equal(confidence, reference.gather(-1, tokens[..., None]).squeeze(-1))
        if settings.get("top_k") == 1:
            assert torch.equal(tokens, logits.argmax(-1))
    tokens, confidence = predict_with_confidence(logits)
    assert torch.equal(tokens, logits.argmax(-1))
    assert torch.equal(confidence, reference.max(-1).values)
