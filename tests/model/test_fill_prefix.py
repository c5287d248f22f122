"""Block diffusion's prefix fill rule (`fill="prefix"`, clover.model.generation_block_diffusion):
a step fills a masked position above the threshold only when every block position to its left is
filled, before or by the same step. So a block fills left to right, never leaving a hole, and with
the causal fallback at `threshold=1.0` the output is still AR decoding's; rows stay independent of
their batch (C4) and the fused commit equals the unfused one (C3).
"""

import pytest
import torch

from clover.model.generation_batch import StepEvent
from clover.model.generation_block_diffusion import block_diffusion_steps, filled_prefix
from clover.model.generation_config import resolve_config
from clover.model.generation_sampling import make_logits_processors
from decoding_helpers import greedy_settings as settings
from decoding_helpers import hand_fallback_fill, left_pad, peaked_model, prompt


@pytest.fixture(scope="module")
def model():
    return peaked_model(seed=1, head_scale=8.0)


def test_filled_prefix_keeps_the_run_that_extends_the_filled_positions():
    """Block [5, M, M, 6, M, M] (M masked): fills at 1, 3 (filled already), 5 -> 1 kept (its left is
    filled), 5 dropped (4 stays masked); over columns [1, 2, 4, 5] with fills at 1, 2, 4 all are kept."""
    m = 99
    block = torch.tensor([[5, m, m, 6, m, m]])
    masked = block == m
    columns = torch.tensor([1, 2, 4, 5])
    kept = filled_prefix(torch.tensor([[True, False, False, True]]), masked, columns)
    assert kept.tolist() == [[True, False, False, False]]
    kept = filled_prefix(torch.tensor([[True, True, True, False]]), masked, columns)
    assert kept.tolist() == [[True, True, True, False]]


def test_every_step_fills_only_after_a_filled_prefix(model):
    """No position a step fills has a masked position to its left after the step. With the causal
    fallback this holds for every step (its run starts at the leftmost masked position); the
    confidence fallback fills the most confident position wherever it is."""
    ids = torch.tensor([prompt(10, seed=10)])
    cfg = resolve_config(None, model.config, dict(threshold=0.6, fill="prefix", fallback="causal", **settings()))
    events = list(block_diffusion_steps(model, ids, torch.ones_like(ids), cfg, make_logits_processors(cfg)))
    steps = [e for e in events if isinstance(e, StepEvent)]
    holes = 0
    for event in steps:
        masked_before = (event.block[0] == model.config.mask_token_id).int().cumsum(0) > 0  # a mask at or left of j
        holes += int((event.filled[0] & masked_before).sum())
    parallel = [e for e in steps if e.filled.sum() > 1]
    assert holes == 0 and parallel  # several positions still fill in one step


def test_the_prefix_rule_changes_decoding(model):
    """Against the same settings with every position above the threshold filled."""
    ids = torch.tensor([prompt(10, seed=10)])
    common = dict(threshold=0.6, fallback="causal", **settings())
    assert not torch.equal(model.generate(ids, fill="prefix", **common), model.generate(ids, **common))


@pytest.mark.parametrize("block_size", [4, 16])
def test_threshold_one_with_the_causal_fallback_is_ar_decoding(model, block_size):
    ids, mask = left_pad([prompt(9, seed=2), prompt(5, seed=3, think=True), prompt(12, seed=4)])
    ar = model.generate(ids, mask, mode="ar", **settings(block_size))
    prefix = model.generate(ids, mask, threshold=1.0, fill="prefix", fallback="causal", **settings(block_size))
    assert torch.equal(prefix, ar)


def test_rows_are_independent_of_their_batch_and_the_commit_fuses(model):
    prompts = [prompt(9, seed=5), prompt(4, seed=6), prompt(11, seed=7, think=True)]
    ids, mask = left_pad(prompts)
    rule = dict(fill="prefix", fallback="causal", threshold=0.7, **settings())
    batched = model.generate(ids, mask, return_dict_in_generate=True, **rule)
    for row, p in enumerate(prompts):
        alone = model.generate(torch.tensor([p]), return_dict_in_generate=True, **rule)
        assert batched.response_ids(row, ids.shape[1]).tolist() == alone.response_ids(0, len(p)).tolist()
    assert torch.equal(model.generate(ids, mask, fuse_commit=False, **rule), batched.sequences)


def test_an_unknown_fill_rule_is_refused(model):
    with pytest.raises(ValueError, match="fill='left'.*threshold.*prefix"):
        model.generate(torch.tensor([prompt(5)]), fill="left", max_new_tokens=8)


def test_the_causal_pass_starts_after_the_confident_run():
    """Block [7, M, M, M, M]; the step filled position 1 (its confident run: 3), guesses [7, 3, 9, 4, 6];
    the causal choices a = [7, 5, 9, 4, 6]. The run stands and the causal pass writes from position 2
    while the guesses agree: [7, 3, 9, 4, 6]. Without the run it starts at 1 and writes a_1 = 5 only."""
    from clover.model.generation_block_diffusion import DenoiseResult

    m = 99  # hand_fallback_fill's mask id
    block = torch.tensor([[7, m, m, m, m]])
    guesses = torch.tensor([[7, 3, 9, 4, 6]])

    def fill(run: list[bool]):
        filled = torch.tensor([run])
        step = DenoiseResult(torch.where(filled, guesses, block), filled, torch.zeros(1, 5), guesses,
                             torch.tensor([True]))
        return hand_fallback_fill(block, step, [7, 5, 9, 4, 6])

    new, written = fill([False, True, False, False, False])
    assert new.tolist() == [[7, 3, 9, 4, 6]] and written.tolist() == [[False, True, True, True, True]]
    new, written = fill([False] * 5)
    assert new.tolist() == [[7, 5, m, m, m]] and written.tolist() == [[False, True, False, False, False]]


def test_a_confident_run_that_leaves_positions_open_goes_to_the_causal_pass(model):
    """With fill="prefix" and the causal fallback, a step whose confident run stops before the block's
    end is marked for the causal pass and fills nothing beyond the run (no most-confident fill)."""
    from clover.model.generation_batch import start_batch
    from clover.model.generation_block_diffusion import denoise_step

    ids = torch.tensor([prompt(10, seed=10)])
    mask_id, size = model.config.mask_token_id, 8
    block = torch.full((1, size), mask_id)
    for fallback, marked in (("causal", True), ("confidence", False)):
        cfg = resolve_config(None, model.config, dict(threshold=0.5, fill="prefix", fallback=fallback, **settings()))
        batch = start_batch(model, ids, torch.ones_like(ids), cfg)
        logits = torch.full((1, size, model.config.vocab_size), -10.0)
        logits[0, :3, 5] = 10.0  # positions 0-2 sure of token 5, the rest unsure (uniform)
        step = denoise_step(logits, block, batch, 0, size, cfg, [], mask_id)
        assert step.filled[0].tolist() == [True] * 3 + [False] * 5
        assert bool(step.fallback[0]) is marked
