"""The evaluation tests' tiny random model and the task tokenizer it is sized for."""

import pytest

from clover.data import train_task_tokenizer
from tiny import tiny_model


@pytest.fixture(scope="module")
def tokenizer():
    return train_task_tokenizer(vocab_size=300, n_examples=200, seed=0)


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_model(vocab_size=len(tokenizer), mask_token_id=tokenizer.convert_tokens_to_ids("<|mask|>"))
