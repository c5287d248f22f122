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
from decoding_helpers import CONTROLS_ON, EOS, left_pad, peaked_model, prompt


@pytest.fixture(scope="module")
def model():
    return peaked_model(seed=1, head_scale=8.0)


def settings(block_size=8, **extra):
    return dict(max_new_tokens=40, do_sample=False, block_size=block_size, eos_token_id=[EOS], **CONTROLS_ON,
                **extra)


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
