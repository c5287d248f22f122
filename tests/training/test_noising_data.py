"""Noise levels and masks per block; left-padded, block-aligned batches; step-addressed datasets."""

import pytest
import torch

from clover.training.data import BatchSpec, Pair, PairDataset, blocked_response, collate
from clover.training.noising import noise_generator, sample_block_noise


def test_noise_is_per_block_seeded_and_only_on_targets():
    targets = torch.ones(64, 32, dtype=torch.bool)
    targets[:, 20:] = False  # block 2 is partly targeted, block 3 not at all
    noise = sample_block_noise(targets, 8, 0.2, noise_generator(1, 2))
    again = sample_block_noise(targets, 8, 0.2, noise_generator(1, 2))
    assert torch.equal(noise.masked, again.masked) and torch.equal(noise.levels, again.levels)
    other = sample_block_noise(targets, 8, 0.2, noise_generator(1, 3))
    assert not torch.equal(noise.masked, other.masked)
    assert not (noise.masked & ~targets).any()
    per_block = noise.masked.view(64, 4, 8).sum(-1)
    assert (per_block[:, :3] >= 1).all() and (per_block[:, 3] == 0).all()
    assert ((noise.levels[:, :3] >= 0.2) & (noise.levels[:, :3] < 1)).all()
    assert (noise.levels[:, 3] == 1).all()
    assert torch.equal(noise.per_token_levels(8)[:, 8:16], noise.levels[:, 1:2].expand(64, 8))


def test_mask_rate_follows_the_level():
    targets = torch.ones(4000, 32, dtype=torch.bool)
    noise = sample_block_noise(targets, 32, 0.01, noise_generator(0, 0))
    rate = noise.masked.float().mean(-1)
    expected = torch.maximum(noise.levels[:, 0], torch.full_like(rate, 1 / 32))
    assert (rate - expected).abs().mean() < 0.06
    assert noise.apply(torch.zeros(4000, 32, dtype=torch.long), 9).eq(9).equal(noise.masked)


def test_collate_left_pads_prompts_and_block_pads_responses_with_eos():
    batch = collate([Pair((5, 6, 7), (20, 21, 22, 1)), Pair((8,), (30, 31, 32, 33, 34))],
                    block_size=4, eos_id=1, pad_id=0)
    assert batch.prompt_ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert batch.prompt_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    # row 0 already ends with EOS: one block; row 1 gets EOS appended, then padding to two blocks
    assert batch.response_ids.tolist() == [[20, 21, 22, 1, 1, 1, 1, 1], [30, 31, 32, 33, 34, 1, 1, 1]]
    assert batch.target_mask.tolist() == [[True] * 4 + [False] * 4, [True] * 8]
    assert batch.num_targets == 12 and batch.num_tokens == 16
    assert blocked_response([3, 4], 4, eos_id=1, eos_ids=(0,), max_len=1) == [3, 1, 1, 1]
    with pytest.raises(ValueError, match="non-empty prompt"):
        collate([Pair((), (1,))], 4, 1, 0)


def _pairs(n):
    return [Pair((100 + i,), tuple(range(i % 7 + 1))) for i in range(n)]


def test_dataset_is_addressed_by_step_and_sharded_by_rank():
    spec = BatchSpec(block_size=4, eos_id=1, pad_id=0)
    data = PairDataset(_pairs(50), spec, batch_size=8, seed=3)
    assert data.batches_per_epoch == 6
    epoch = [i for step in range(6) for i in data.indices(step)]
    assert len(set(epoch)) == 48  # no example twice in an epoch
    assert data.indices(6) != data.indices(0)  # a new order next epoch
    fresh = PairDataset(_pairs(50), spec, batch_size=8, seed=3)
    assert fresh.indices(13) == data.indices(13)  # no iterator state: resume by step
    whole = data.batch(4)
    halves = [data.batch(4, rank, 2) for rank in (0, 1)]
    assert torch.equal(torch.cat([h.prompt_ids for h in halves])[:, -1], whole.prompt_ids[:, -1])
    with pytest.raises(ValueError, match="divisible"):
        data.batch(0, 0, 3)


def test_group_by_length_makes_batches_of_similar_length():
    spec = BatchSpec(block_size=4, eos_id=1, pad_id=0)
    pairs = _pairs(256)
    grouped = PairDataset(pairs, spec, batch_size=8, seed=0, group_by_length=True)
    plain = PairDataset(pairs, spec, batch_size=8, seed=0)

    def spread(data):
        return sum(max(len(pairs[i].response_ids) for i in data.indices(s))
                   - min(len(pairs[i].response_ids) for i in data.indices(s)) for s in range(32))

    assert spread(grouped) < spread(plain) / 3
    assert sorted(i for s in range(32) for i in grouped.indices(s)) == list(range(256))
