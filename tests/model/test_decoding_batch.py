"""C3 (fused commit = separate commit) and C4 (batch = batch of one), greedy."""

import pytest
import torch

from decoding_helpers import CONTROLS_ON, EOS, left_pad, one_thread, peaked_model, prompt, response  # noqa: F401

SETTINGS = dict(CONTROLS_ON, max_new_tokens=21, eos_token_id=[EOS], pad_token_id=0)


@pytest.fixture(scope="module")
def model():
    return peaked_model(seed=2)


@pytest.mark.parametrize("threshold", [0.5, 1.0])
def test_fused_commit_equals_separate_commit(model, threshold):
    ids = torch.tensor([prompt(11, seed=5, think=True)])
    fused = model.generate(ids, block_size=8, threshold=threshold, return_dict_in_generate=True, **SETTINGS)
    split = model.generate(ids, block_size=8, threshold=threshold, fuse_commit=False,
                           return_dict_in_generate=True, **SETTINGS)
    assert torch.equal(fused.sequences, split.sequences)
    assert fused.rows[0].steps_per_block == split.rows[0].steps_per_block
    blocks = len(fused.rows[0].steps_per_block)
    # unfused: one more forward per commit, and the prefill is not shared with the first step
    assert split.num_forward_passes == fused.num_forward_passes + (blocks - 1) + 1


@pytest.mark.parametrize("mode", ["block_diffusion", "ar"])
def test_batch_equals_batch_of_one(model, mode):
    prompts = [prompt(4, seed=1), prompt(13, seed=2, think=True), prompt(8, seed=3)]
    ids, mask = left_pad(prompts, pad=7)
    batch = model.generate(ids, attention_mask=mask, block_size=4, threshold=0.8, mode=mode,
                           return_dict_in_generate=True, **SETTINGS)
    for row, p in enumerate(prompts):
        single = model.generate(torch.tensor([p]), block_size=4, threshold=0.8, mode=mode,
                                return_dict_in_generate=True, **SETTINGS)
        n = single.rows[0].new_tokens
        assert response(batch, ids.shape[1], row, n) == response(single, len(p))
        assert batch.rows[row].new_tokens == n
        assert batch.rows[row].steps_per_block == single.rows[0].steps_per_block
        assert torch.equal(batch.sequences[row, :ids.shape[1]], ids[row])  # prompt kept as given


def test_chunked_prefill_equals_one_chunk(model):
    ids, mask = left_pad([prompt(19, seed=8), prompt(6, seed=9)])
    whole = model.generate(ids, attention_mask=mask, block_size=8, **SETTINGS)
    chunked = model.generate(ids, attention_mask=mask, block_size=8, prefill_chunk_size=4, **SETTINGS)
    assert torch.equal(whole, chunked)
