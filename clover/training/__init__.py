"""Post-training into Clover (SPEC §8): noising, the joint loss through the inference code path,
batches, the trainer, recipes and torchrun support."""

from .data import Batch, BatchSpec, Pair, PairDataset, collate
from .loss import JointLoss, LossResult, StreamLogits, joint_loss, stream_logits
from .noising import BlockNoise, noise_generator, sample_block_noise
from .recipe import Recipe, load_recipe, recipe_from_dict
from .trainer import TrainConfig, Trainer, TrainSummary

__all__ = ["Batch", "BatchSpec", "BlockNoise", "JointLoss", "LossResult", "Pair", "PairDataset",
           "Recipe", "StreamLogits", "TrainConfig", "TrainSummary", "Trainer", "collate", "joint_loss",
           "load_recipe", "noise_generator", "recipe_from_dict", "sample_block_noise", "stream_logits"]
