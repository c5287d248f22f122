"""Shared pieces for training tests: one intra-op thread (tiny ops are far faster without thread
hand-offs on a small CPU), a tiny digits model and dataset."""

import pytest
import torch

from clover.model import CloverMoeConfig, CloverMoeForCausalLM
from clover.training.data import BatchSpec, PairDataset
from clover.training.sources import DIGIT_ROLES, DigitTask

DIGITS_MODEL = dict(
    vocab_size=16, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
    linear_value_head_dim=8, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, max_position_embeddings=256,
    mask_token_id=DIGIT_ROLES.mask_id, eos_token_id=DIGIT_ROLES.eos_id, pad_token_id=DIGIT_ROLES.pad_id,
)


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def digits_model(seed: int = 0, **overrides) -> CloverMoeForCausalLM:
    torch.manual_seed(seed)
    return CloverMoeForCausalLM(CloverMoeConfig(**{**DIGITS_MODEL, **overrides}))


def digits_dataset(batch_size: int, block_size: int = 4, max_len: int = 5, seed: int = 0) -> PairDataset:
    spec = BatchSpec(block_size, DIGIT_ROLES.eos_id, DIGIT_ROLES.pad_id, DIGIT_ROLES.eos_ids)
    return PairDataset(DigitTask(min_len=2, max_len=max_len, seed=seed), spec, batch_size, seed)
