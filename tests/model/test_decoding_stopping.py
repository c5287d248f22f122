"""EOS truncation, early block end, `max_new_tokens` limits, right padding, row dropping."""

import torch

from clover.model.generation import stream_generate
from clover.model.generation_batch import BlockEvent, StepEvent
from decoding_helpers import CONTROLS_OFF, left_pad, one_thread, peaked_model, prompt, response  # noqa: F401
from scripted_model import ScriptedModel

EOS = 9
SETTINGS = dict(CONTROLS_OFF, eos_token_id=[EOS], pad_token_id=0, threshold=0.9)


def stream(model, prompts, **kwargs):
    return stream_generate(model, torch.tensor(prompts), **SETTINGS, **kwargs)


def test_block_ends_at_first_eos_with_everything_before_it_filled():
    # EOS at response position 2 is confident at once; 0 and 1 fill by the fallback, then the
    # block ends although positions 3..7 are still masks.
    script = {0: (20, 0.6), 1: (21, 0.5), 2: (EOS, 0.99), 3: (22, 0.95), 4: (EOS, 0.99)}
    model = ScriptedModel(4, script)
    events = list(stream(model, [[10, 11, 12, 13]], block_size=8, max_new_tokens=30))
    steps = [e for e in events if isinstance(e, StepEvent)]
    blocks = [e for e in events if isinstance(e, BlockEvent)]
    assert [e.filled_list()[0] for e in steps] == [[(2, EOS), (3, 22), (4, EOS)], [(0, 20)], [(1, 21)]]
    assert len(blocks) == 1 and blocks[0].tokens == [20, 21, EOS] and blocks[0].finished
    out = events[-1].output
    assert out.sequences[0].tolist() == [10, 11, 12, 13, 20, 21, EOS]
    assert out.rows[0].stop_reason == "eos" and out.rows[0].steps_per_block == [3]
    assert out.num_forward_passes == 3 and len(model.calls) == 3


def test_step_events_carry_the_confidence_the_rule_read():
    """Each step's confidences: the filled positions passed the threshold, or the step filled the
    single most confident candidate (the fallback); positions already filled read -1."""
    script = {0: (20, 0.6), 1: (21, 0.5), 2: (EOS, 0.99), 3: (22, 0.95), 4: (EOS, 0.99)}
    events = list(stream(ScriptedModel(4, script), [[10, 11, 12, 13]], block_size=8, max_new_tokens=30))
    steps = [e for e in events if isinstance(e, StepEvent)]
    confidence = [[round(c, 3) for c in e.confidence[0].tolist()] for e in steps]
    assert confidence[0] == [0.6, 0.5, 0.99, 0.95, 0.99, 0.2, 0.2, 0.2]
    assert confidence[1] == [0.6, 0.5, -1.0, -1.0, -1.0, 0.2, 0.2, 0.2]  # the fallback fills 0
    assert confidence[2] == [-1.0, 0.5, -1.0, -1.0, -1.0, 0.2, 0.2, 0.2]
    for e in steps:
        filled, conf = e.filled[0], e.confidence[0]
        passed = filled & (conf > SETTINGS["threshold"])
        assert passed.any() or (filled.sum() == 1 and conf[filled].item() == conf.max().item())


def test_eos_late_in_a_block_waits_for_the_positions_before_it():
    script = {1: (EOS, 0.99), 5: (EOS, 0.99)}  # the EOS at 1 is the first: position 0 must fill first
    model = ScriptedModel(2, script)
    out = list(stream(model, [[10, 11]], block_size=4, max_new_tokens=8))[-1].output
    assert out.sequences[0].tolist() == [10, 11, 8, EOS]


def test_max_new_tokens_not_a_multiple_of_the_block():
    model = ScriptedModel(3, {})
    events = list(stream(model, [[10, 11, 12]], block_size=4, max_new_tokens=6))
    out = events[-1].output
    assert out.sequences.shape == (1, 9) and out.rows[0].new_tokens == 6
    assert out.rows[0].stop_reason == "length" and out.rows[0].steps_per_block == [4, 2]
    last = [e for e in events if isinstance(e, StepEvent) and e.block_index == 1]
    assert all(not e.filled[0, 2:].any() for e in last)  # positions past the limit never fill


def test_batch_rows_finish_on_their_own_and_are_right_padded():
    # the row with the shorter prompt meets the scripted EOS one response position later
    model = ScriptedModel(3, {1: (EOS, 0.99)})
    ids, mask = left_pad([[10, 11, 12], [13, 14]])
    out = list(stream(model, ids.tolist(), attention_mask=mask, block_size=2, max_new_tokens=6))[-1].output
    assert out.sequences.tolist() == [[10, 11, 12, 8, EOS, 0], [0, 13, 14, 8, 8, EOS]]
    assert [r.stop_reason for r in out.rows] == ["eos", "eos"]
    # block 0: both rows (2 steps); commit fused with block 1 for row 1 only (1 step)
    assert [c[0] for c in model.calls] == [2, 2, 1]


def test_finished_rows_leave_the_batch():
    model = peaked_model()
    a, b = prompt(5, seed=1), prompt(9, seed=2)
    settings = dict(CONTROLS_OFF, block_size=4, max_new_tokens=40, pad_token_id=0)
    free_a = response(model.generate(torch.tensor([a]), **settings, eos_token_id=[]), 5)
    free_b = response(model.generate(torch.tensor([b]), **settings, eos_token_id=[]), 9)
    eos = next(t for t in free_a[4:] if t not in free_b)  # row a stops in block >= 1, row b never
    first = free_a.index(eos)
    sizes = []
    original = model.forward
    def spy(input_ids, *args, **kwargs):
        sizes.append(input_ids.shape[0])
        return original(input_ids, *args, **kwargs)

    model.forward = spy
    ids, mask = left_pad([a, b])
    out = model.generate(ids, attention_mask=mask, **settings, eos_token_id=[eos],
                         return_dict_in_generate=True)
    assert response(out, 9, row=0) == free_a[:first + 1] + [0] * (39 - first)
    assert response(out, 9, row=1) == free_b
    assert out.rows[0].new_tokens == first + 1 and out.rows[1].new_tokens == 40
    assert out.rows[0].num_forwards < out.rows[1].num_forwards == out.num_forward_passes
    assert sizes[out.rows[0].num_forwards:] == [1] * (len(sizes) - out.rows[0].num_forwards)


def test_eos_truncation_matches_the_run_without_eos():
    model = peaked_model(seed=1)
    ids = torch.tensor([prompt(8, seed=4)])
    free = response(model.generate(ids, block_size=8, max_new_tokens=24, **CONTROLS_OFF, eos_token_id=[]), 8)
    eos = free[9]
    out = response(model.generate(ids, block_size=8, max_new_tokens=24, **CONTROLS_OFF, eos_token_id=[eos],
                                  pad_token_id=0), 8)
    first = free.index(eos)
    assert out == free[:first + 1]
