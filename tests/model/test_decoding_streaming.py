"""The event stream: what `generate` consumes, and what a live view needs."""

import torch

from clover.model.generation_batch import BlockEvent, DoneEvent, StepEvent
from decoding_helpers import CONTROLS_ON, EOS, left_pad, one_thread, peaked_model, prompt  # noqa: F401


def test_events_tell_the_whole_story():
    model = peaked_model()
    ids, mask = left_pad([prompt(5, seed=1), prompt(8, seed=2)])
    settings = dict(CONTROLS_ON, block_size=4, threshold=0.8, max_new_tokens=14, eos_token_id=[EOS])
    events = list(model.stream_generate(ids, attention_mask=mask, **settings))
    assert isinstance(events[-1], DoneEvent)
    out = events[-1].output
    assert torch.equal(out.sequences, model.generate(ids, attention_mask=mask, **settings))
    for row in range(2):
        blocks = [e for e in events if isinstance(e, BlockEvent) and e.row == row]
        streamed = [t for e in blocks for t in e.tokens]
        assert streamed == out.sequences[row, 8:8 + out.rows[row].new_tokens].tolist()
        assert [e.block_index for e in blocks] == list(range(len(blocks)))
        assert blocks[-1].finished and not any(e.finished for e in blocks[:-1])
        # every committed position was filled by exactly one step, with the committed token
        filled = {}
        for e in events:
            if isinstance(e, StepEvent) and row in e.rows:
                for j, t in e.filled_list()[e.rows.index(row)]:
                    assert (e.block_index, j) not in filled
                    filled[e.block_index, j] = t
        assert [filled[i // 4, i % 4] for i in range(len(streamed))] == streamed
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert len(steps) == out.num_forward_passes  # fused commits: one step per forward


def test_transformers_style_streamer_gets_prompt_then_blocks():
    model = peaked_model()
    ids = torch.tensor([prompt(5)])

    class Recorder:
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.tolist())

        def end(self):
            self.ended = True

    recorder = Recorder()
    out = model.generate(ids, streamer=recorder, block_size=4, max_new_tokens=10, eos_token_id=[EOS])
    assert recorder.ended and recorder.chunks[0] == ids.tolist()
    assert sum(recorder.chunks[1:], []) == out[0, 5:].tolist()
