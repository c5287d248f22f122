"""C7: the training streams equal what inference computes (fp32, coreset off)."""

import pytest
import torch

from clover.training.data import Pair, collate
from clover.training.loss import JointLoss, joint_loss, stream_logits
from clover.training.noising import noise_generator, sample_block_noise
from tiny import tiny_model

BLOCK = 4
EOS, PAD, MASK = 3, 0, 127
PAIRS = [Pair((5, 6, 7, 8, 9, 10, 11), tuple(range(20, 31))),  # 11 + EOS -> 3 blocks
         Pair((12, 13, 14), tuple(range(40, 45)))]  # 5 + EOS -> 2 blocks, 1 untargeted


def _setup():
    model = tiny_model(seed=1)
    batch = collate(PAIRS, BLOCK, EOS, PAD)
    noise = sample_block_noise(batch.target_mask, BLOCK, 0.05, noise_generator(0, 0))
    return model, batch, noise, noise.apply(batch.response_ids, MASK)


def _row(batch, i):
    real = batch.prompt_mask[i].bool()
    return batch.prompt_ids[i, real][None], batch.response_ids[i][None]


@pytest.mark.parametrize("coreset", [False, True])
@torch.no_grad()
def test_noisy_stream_equals_inference_block_mode(coreset):
    """Coreset off, and on in both (it selects experts per row and block, as at inference)."""
    model, batch, noise, noisy = _setup()
    logits = stream_logits(model, batch, noisy, BLOCK, use_coreset=coreset)
    worst = 0.0
    for i in range(len(PAIRS)):
        prompt, response = _row(batch, i)
        for start in range(0, response.shape[1], BLOCK):
            cache = model.new_cache()
            model(torch.cat((prompt, response[:, :start]), 1), past_key_values=cache, use_cache=True)
            ref = model(noisy[i:i + 1, start:start + BLOCK], past_key_values=cache, block_len=BLOCK,
                        use_coreset=coreset).logits
            got = logits.diff[i:i + 1, start:start + BLOCK]
            worst = max(worst, (got - ref).abs().max().item())
    assert worst <= 1e-4, worst


@torch.no_grad()
def test_clean_stream_equals_plain_causal_forward():
    model, batch, _, noisy = _setup()
    logits = stream_logits(model, batch, noisy, BLOCK, use_coreset=False)
    for i in range(len(PAIRS)):
        prompt, response = _row(batch, i)
        ref = model(torch.cat((prompt, response), 1)).logits[:, prompt.shape[1] - 1:-1]
        torch.testing.assert_close(logits.ar[i:i + 1], ref, atol=1e-4, rtol=0)


def test_loss_terms_and_gradients_through_the_cache():
    model, batch, noise, noisy = _setup()
    result = JointLoss(model, BLOCK, alpha=0.5, use_coreset=False)(batch, noise)
    assert result.num_targets == 12 + 8
    assert result.num_masked == int((noise.masked & batch.target_mask).sum()) >= 5
    torch.testing.assert_close(result.total, result.l_ar + 0.5 * result.l_diff)
    # L_diff of the last block reaches the first prompt token's embedding only through the cache
    grad = torch.autograd.grad(result.l_diff, model.model.embed_tokens.weight)[0]
    assert grad[5].abs().sum() > 0 and grad[MASK].abs().sum() > 0
    # the untargeted last block of row 1 carries no loss
    with torch.no_grad():
        logits = stream_logits(model, batch, noisy, BLOCK, use_coreset=False)
        again = joint_loss(logits, batch, noise, BLOCK, 0.5)
    torch.testing.assert_close(again.total, result.total)
