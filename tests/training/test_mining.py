"""Hard-example mining: each answer's loss is its own (batch rows independent, block padding not
counted), and the hardest share of each group is kept."""

import pytest
import torch

from clover.training.data import BatchSpec, Pair
from clover.training.mining import answer_losses, hardest_per_group
from clover.training.sources import DIGIT_ROLES, DigitTask

from tests.training.conftest import digits_model

SPEC = BatchSpec(4, DIGIT_ROLES.eos_id, DIGIT_ROLES.pad_id, DIGIT_ROLES.eos_ids)


def reference_loss(model, pair: Pair) -> float:
    """-log p(response + EOS | prompt) from one unpadded causal forward, token by token."""
    response = [*pair.response_ids]
    if response[-1] not in DIGIT_ROLES.eos_ids:
        response.append(DIGIT_ROLES.eos_id)
    ids = torch.tensor([[*pair.prompt_ids, *response]])
    with torch.no_grad():
        logp = model(ids).logits[0].float().log_softmax(-1)
    p = len(pair.prompt_ids)
    return -sum(logp[p - 1 + j, t].item() for j, t in enumerate(response))


def test_answer_losses_equal_each_answer_alone():
    """Batched (rows of other lengths, left padding, block padding) equals one pair at a time."""
    model = digits_model().eval()
    pairs = DigitTask(min_len=1, max_len=7, seed=3).pairs(0, 11)
    assert len({len(p.response_ids) % SPEC.block_size for p in pairs}) > 1  # some rows are block-padded
    losses = answer_losses(model, pairs, SPEC, batch_size=4)
    expected = [reference_loss(model, p) for p in pairs]
    assert losses == pytest.approx(expected, rel=1e-5, abs=1e-5)
    assert model.training is False


def test_answer_losses_restore_training_mode_and_report_progress():
    model = digits_model().train()
    pairs = DigitTask(seed=1).pairs(0, 5)
    seen = []
    answer_losses(model, pairs, SPEC, batch_size=2, progress=lambda done, total: seen.append((done, total)))
    assert model.training and seen == [(2, 5), (4, 5), (5, 5)]


def test_a_model_that_learned_an_answer_finds_it_easier():
    """The loss ranks by what the model knows: a pair trained on scores below the untrained ones."""
    model = digits_model()
    pairs = DigitTask(seed=2).pairs(0, 4)
    before = answer_losses(model, pairs, SPEC)
    batch = SPEC.collate(pairs[:1])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(30):
        ids = torch.cat((batch.prompt_ids, batch.response_ids), dim=1)
        logits = model(ids).logits[:, batch.prompt_ids.shape[1] - 1:-1]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.response_ids.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = answer_losses(model, pairs, SPEC)
    assert after[0] < before[0] / 4
    assert hardest_per_group(after, ["digits"] * 4, 0.75) == [1, 2, 3]


def test_hardest_per_group_keeps_each_groups_share():
    losses = [0.1, 5.0, 0.3, 2.0, 9.0, 0.2, 0.4, 1.0]
    groups = ["a", "a", "a", "a", "b", "b", "b", "b"]
    assert hardest_per_group(losses, groups, 0.5) == [1, 3, 4, 7]  # a: 5.0, 2.0; b: 9.0, 1.0
    assert hardest_per_group(losses, groups, 0.1) == [1, 4]  # at least one of each group
    assert hardest_per_group(losses, groups, 1.0) == list(range(8))
    assert hardest_per_group([1.0, 1.0, 1.0], ["a"] * 3, 0.34) == [0]  # a tie keeps the earlier


@pytest.mark.parametrize("share, losses, groups, message", [
    (0.0, [1.0], ["a"], r"share=0.0 must be in \(0, 1\]"),
    (1.5, [1.0], ["a"], r"share=1.5 must be in \(0, 1\]"),
    (0.5, [1.0, 2.0], ["a"], "2 losses for 1 group labels"),
])
def test_hardest_per_group_refuses_bad_input(share, losses, groups, message):
    with pytest.raises(ValueError, match=message):
        hardest_per_group(losses, groups, share)
