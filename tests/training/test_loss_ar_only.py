"""α = 0: the AR-only objective computes the clean stream in one causal forward, equal to the
clean stream of the fused block loop (so AR pre-training and joint post-training agree)."""

import torch

from clover.training.data import Pair, collate
from clover.training.loss import JointLoss, causal_logits, joint_loss, stream_logits
from clover.training.noising import noise_generator, sample_block_noise
from tiny import tiny_model


def _batch():
    pairs = [Pair((5, 6, 7, 8), (9, 10, 11, 12, 13, 1)), Pair((7, 8), (14, 15, 1))]
    return collate(pairs, block_size=4, eos_id=1, pad_id=0, eos_ids=(1, 0))


def test_causal_logits_equal_the_fused_loop_clean_stream():
    torch.manual_seed(0)
    model = tiny_model().eval()
    batch = _batch()
    with torch.no_grad():
        fused = stream_logits(model, batch, batch.response_ids, block_size=4).ar
        direct = causal_logits(model, batch)
    real = batch.target_mask
    assert torch.allclose(fused[real], direct[real], atol=1e-4), (fused[real] - direct[real]).abs().max()


def test_alpha_zero_is_the_ar_term_of_the_joint_loss():
    torch.manual_seed(0)
    model = tiny_model()
    batch = _batch()
    noise = sample_block_noise(batch.target_mask, 4, 0.1, noise_generator(0, 0))
    ar_only = JointLoss(model, 4, alpha=0.0)(batch, noise)
    joint = joint_loss(stream_logits(model, batch, noise.apply(batch.response_ids, model.config.mask_token_id), 4),
                       batch, noise, 4, alpha=1.0)
    assert torch.allclose(ar_only.l_ar, joint.l_ar, atol=1e-5)
    assert ar_only.l_diff.item() == 0.0 and ar_only.total.requires_grad
