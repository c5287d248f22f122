"""The causal fallback of block diffusion (`fallback="causal"`, clover.model.generation_causal_fallback):
at `threshold=1.0` every step is a fallback, so the output is AR decoding's, token for token (greedy,
controls on, every block size); rows stay independent of their batch (C4) and the fused commit
equals the unfused one (C3); at the default threshold it decodes differently from the confidence
fallback and counts its causal passes as forwards.
"""

import pytest
import torch

from clover.model.generation_batch import StepEvent
from clover.model.generation_block_diffusion import block_diffusion_steps
from clover.model.generation_config import resolve_config
from clover.model.generation_sampling import make_logits_processors
from decoding_helpers import greedy_settings as settings
from decoding_helpers import hand_fallback_fill, left_pad, peaked_model, prompt


@pytest.fixture(scope="module")
def model():
    return peaked_model(seed=1, head_scale=8.0)


@pytest.mark.parametrize("block_size", [4, 8, 16, 32])
def test_threshold_one_with_the_causal_fallback_is_ar_decoding(model, block_size):
    ids, mask = left_pad([prompt(9, seed=2), prompt(5, seed=3, think=True), prompt(12, seed=4)])
    ar = model.generate(ids, mask, mode="ar", **settings(block_size))
    causal = model.generate(ids, mask, threshold=1.0, fallback="causal", **settings(block_size))
    assert torch.equal(causal, ar)


def test_rows_are_independent_of_their_batch(model):
    prompts = [prompt(9, seed=5), prompt(4, seed=6), prompt(11, seed=7, think=True)]
    ids, mask = left_pad(prompts)
    batched = model.generate(ids, mask, fallback="causal", threshold=0.7, return_dict_in_generate=True,
                             **settings())
    for row, p in enumerate(prompts):
        alone = model.generate(torch.tensor([p]), fallback="causal", threshold=0.7, return_dict_in_generate=True,
                               **settings())
        assert batched.response_ids(row, ids.shape[1]).tolist() == alone.response_ids(0, len(p)).tolist()


def test_fused_commit_equals_unfused(model):
    ids, mask = left_pad([prompt(9, seed=8), prompt(6, seed=9)])
    fused = model.generate(ids, mask, fallback="causal", threshold=0.7, **settings())
    unfused = model.generate(ids, mask, fallback="causal", threshold=0.7, fuse_commit=False, **settings())
    assert torch.equal(fused, unfused)


def test_the_causal_fallback_changes_decoding_and_counts_its_passes(model):
    ids = torch.tensor([prompt(10, seed=10)])
    confident = model.generate(ids, threshold=0.9, **settings())
    cfg = resolve_config(None, model.config, dict(threshold=0.9, fallback="causal", **settings()))
    events = list(block_diffusion_steps(model, ids, torch.ones_like(ids), cfg, make_logits_processors(cfg)))
    steps = [e for e in events if isinstance(e, StepEvent)]
    # a fallback step fills no position above the threshold: the causal pass chose its tokens
    fallbacks = [e for e in steps if e.filled.any() and (e.confidence[e.filled] <= 0.9).all()]
    output = events[-1].output
    assert not torch.equal(confident, output.sequences)
    assert fallbacks and output.num_forward_passes == len(steps) + len(fallbacks) + output.num_prefill_forwards


def test_an_unknown_fallback_is_refused(model):
    with pytest.raises(ValueError, match="fallback='left'.*confidence.*causal"):
        model.generate(torch.tensor([prompt(5)]), fallback="left", max_new_tokens=8)


def test_the_run_from_the_first_masked_position_and_where_it_ends():
    """Block [7, M, 9, M, M], guesses [7, 3, 9, 4, 6]: the causal choices a = [7, 3, 8, 4, 6] agree up
    to position 2, where the filled 9 is overruled by 8 and the run ends (3 and 4 stay masked); with
    a_1 = 5 the run ends at position 1."""
    from clover.model.generation_block_diffusion import DenoiseResult

    m = 99  # hand_fallback_fill's mask id
    block = torch.tensor([[7, m, 9, m, m]])
    guesses = torch.tensor([[7, 3, 9, 4, 6]])
    step = DenoiseResult(block, torch.zeros_like(block, dtype=torch.bool), torch.zeros(1, 5), guesses,
                         torch.tensor([True]))

    def fill(choices):
        return hand_fallback_fill(block, step, choices)

    new, written = fill([7, 3, 8, 4, 6])
    assert new.tolist() == [[7, 3, 8, m, m]] and written.tolist() == [[False, True, True, False, False]]
    new, written = fill([7, 5, 9, 4, 6])
    assert new.tolist() == [[7, 5, 9, m, m]] and written.tolist() == [[False, True, False, False, False]]
