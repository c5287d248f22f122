"""Per-block masking noise for the noisy stream (SPEC §8).

Each block b of a row's response gets its own level t_b ~ U(eps, 1), or U(eps, max_level) with the
training option `max_level` < 1 (with `max_level_share` < 1, only that share of blocks, drawn block
by block, so that every batch holds both low and full-range levels; or, with `max_level_per`
"step", that share of whole steps, spread evenly: `step_level_bounds`); each target token of the
block is masked with probability t_b, and at least one per block is masked. Blocks without any
target (past the end of a shorter row's response) get no mask and t_b = 1.

With `suffix` > 0 (a training option, 0 by default) each block is instead, with that probability,
masked from a uniformly drawn position to its end (at least its last target), with t_b the share of
its targets masked. Decoding fills a block roughly from left to right, so a token is mostly decided
with the tokens to its right still masked; under random masks alone a model can learn to read a
token off the ones to its right (a written check off the derivation's structure after it), which
decoding then does not give it.
"""

import math
from dataclasses import dataclass

import torch

LEVEL_UNITS = ("block", "step")  # what the training option max_level_share counts


@dataclass(frozen=True)
class BlockNoise:
    levels: torch.Tensor  # [N, num_blocks] t_b in [eps, 1)
    masked: torch.Tensor  # [N, R] bool, True where the noisy stream shows <|mask|>

    def per_token_levels(self, block_size: int) -> torch.Tensor:
        """t_b broadcast to every position of its block -> [N, R]."""
        return self.levels.repeat_interleave(block_size, dim=1)

    def apply(self, response_ids: torch.Tensor, mask_token_id: int) -> torch.Tensor:
        """The noisy response: masked positions replaced by `mask_token_id`."""
        return response_ids.masked_fill(self.masked.to(response_ids.device), mask_token_id)

    def to(self, device) -> "BlockNoise":
        return BlockNoise(self.levels.to(device), self.masked.to(device))


def noise_generator(seed: int, step: int, rank: int = 0) -> torch.Generator:
    """A CPU generator that depends only on (seed, step, rank): noise needs no saved RNG state,
    so a resumed run draws exactly the noise the uninterrupted run would have drawn. Training
    passes an example's position in the global batch as `rank`, so noise does not depend on the
    world size either."""
    gen = torch.Generator()
    gen.manual_seed(((seed * 1_000_003 + step) * 8_191 + rank) % (2 ** 63))
    return gen


def step_level_bounds(step: int, max_level: float, share: float, per: str) -> tuple[float, float]:
    """The (max_level, max_level_share) that `sample_block_noise` gets at `step` (0-based). With `per`
    "block" they are unchanged; with "step", `max_level` bounds every block of a `share` of the steps,
    spread evenly (share 1/2: every other step, from step 1 on), and the other steps draw U(eps, 1)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share={share} must be in [0, 1]")
    if per not in LEVEL_UNITS:
        raise ValueError(f"per={per!r} must be one of {LEVEL_UNITS}")
    if per == "block":
        return max_level, share
    return (max_level if math.floor((step + 1) * share) > math.floor(step * share) else 1.0), 1.0


def sample_block_noise(target_mask: torch.Tensor, block_size: int, eps: float,
                       generator: torch.Generator, suffix: float = 0.0, max_level: float = 1.0,
                       max_level_share: float = 1.0) -> BlockNoise:
    """target_mask [N, R] (bool, R a multiple of block_size) -> a `BlockNoise` drawn on the CPU,
    with levels t_b ~ U(eps, max_level) on a `max_level_share` of the blocks and U(eps, 1) on the rest."""
    if not 0.0 < eps < 1.0:
        raise ValueError(f"eps={eps} must be in (0, 1)")
    if not eps < max_level <= 1.0:
        raise ValueError(f"max_level={max_level} must be in (eps={eps}, 1]")
    if not 0.0 <= max_level_share <= 1.0:
        raise ValueError(f"max_level_share={max_level_share} must be in [0, 1]")
    if not 0.0 <= suffix <= 1.0:
        raise ValueError(f"suffix={suffix} must be in [0, 1]")
    n, r = target_mask.shape
    if r % block_size:
        raise ValueError(f"response length {r} is not a multiple of block_size={block_size}")
    targets = target_mask.cpu().view(n, r // block_size, block_size)  # [N, nb, B]
    levels = torch.rand(n, r // block_size, generator=generator)  # [N, nb] in [0, 1)
    top = max_level  # the highest level, or [N, nb] per block with the share option
    if max_level_share < 1.0:  # an extra draw only with the option, so the default noise is unchanged
        top = torch.where(torch.rand(levels.shape, generator=generator) < max_level_share, max_level, 1.0)
    levels = eps + (top - eps) * levels
    draws = torch.rand(targets.shape, generator=generator)
    masked = (draws < levels[..., None]) & targets
    # at least one masked token per block with targets: force the target with the smallest draw
    forced = draws.masked_fill(~targets, 2.0).argmin(-1, keepdim=True)
    force = torch.zeros_like(masked).scatter(-1, forced, True) & targets
    needs_one = ~masked.any(-1, keepdim=True)
    masked = masked | (force & needs_one)
    if suffix:  # extra draws only with the option, so the default noise is unchanged
        masked, levels = _suffix_masks(targets, masked, levels, suffix, generator)
    levels = torch.where(targets.any(-1), levels, torch.ones_like(levels))
    return BlockNoise(levels, masked.view(n, r))


def _suffix_masks(targets: torch.Tensor, masked: torch.Tensor, levels: torch.Tensor, suffix: float,
                  generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Replace each block's mask [N, nb, B], with probability `suffix`, by one over its positions from
    a uniform cut to the end (at least its last target: a block's targets are a prefix of it); its
    level becomes the share masked."""
    n, nb, size = targets.shape
    chosen = torch.rand(n, nb, generator=generator) < suffix
    count = targets.sum(-1)  # [N, nb] targets per block
    cut = (torch.rand(n, nb, generator=generator) * count).long()  # in [0, count - 1]
    tail = (torch.arange(size) >= cut[..., None]) & targets
    share = tail.sum(-1) / count.clamp(min=1)
    return torch.where(chosen[..., None], tail, masked), torch.where(chosen, share, levels)


def sample_example_noise(target_mask: torch.Tensor, block_size: int, eps: float,
                         generators: list[torch.Generator], suffix: float = 0.0,
                         max_level: float = 1.0, max_level_share: float = 1.0) -> BlockNoise:
    """Like `sample_block_noise`, but row i draws from `generators[i]` and only for its own blocks
    with targets, so a row's noise does not depend on which rows share its batch (padding)."""
    n, r = target_mask.shape
    if len(generators) != n:
        raise ValueError(f"{len(generators)} generators for {n} rows")
    levels = torch.ones(n, r // block_size)
    masked = torch.zeros(n, r, dtype=torch.bool)
    for i, gen in enumerate(generators):
        blocks = -(-int(target_mask[i].sum()) // block_size)  # targets are a prefix of the row
        row = sample_block_noise(target_mask[i:i + 1, :blocks * block_size], block_size, eps, gen, suffix,
                                 max_level, max_level_share)
        levels[i, :blocks], masked[i, :blocks * block_size] = row.levels[0], row.masked[0]
    return BlockNoise(levels, masked)
