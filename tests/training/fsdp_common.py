"""The tiny run that the FSDP tests and `fsdp_worker` share (imports no test fixtures)."""

from clover.training.data import BatchSpec, PairDataset
from clover.training.sources import DIGIT_ROLES, DigitTask
from clover.training.trainer import TrainConfig

STEPS = 5
BATCH = 8


def config(**overrides) -> TrainConfig:
    return TrainConfig(**{**dict(steps=STEPS, batch_size=BATCH, block_size=4, lr=5e-3, warmup_steps=1,
                                 eps=0.1, log_interval=1, seed=5), **overrides})


def dataset() -> PairDataset:
    spec = BatchSpec(4, DIGIT_ROLES.eos_id, DIGIT_ROLES.pad_id, DIGIT_ROLES.eos_ids)
    return PairDataset(DigitTask(min_len=2, max_len=6, seed=2), spec, BATCH, seed=2)


def model(seed: int = 0):
    import torch

    from tests.training.conftest import digits_model

    torch.manual_seed(seed)
    return digits_model(seed)
