"""How fast does block mode learn a written check under Clover's training noise?

`joint`'s signed checks (`JointTask(checks="signed")`) write `A=B+` or `A=B-`: the sign says whether
the two words before it are equal. AR decoding learns it at once; block diffusion's decoding gets it
wrong when the text to the sign's right is still masked (BENCHMARKS.md). This probe trains a fresh
4-layer Clover model (hidden 96, `membership_probe.small_model`) from scratch on rows of such checks
(A and B drawn from 6 one-token properties, equal half the time; the row after its first token is
one block) with both Clover losses: AR on every token, and block mode on a noisy copy of the row,
cross-entropy over the masked tokens weighted 1/t as the trainer does (`clover.training.loss`), or
with `--signs-only` over the masked signs alone.
The noise is either

- `checks`: each sign masked with probability 1/2 (at least one), every other token shown (t = 1/2);
- `clover`: the trainer's own (`clover.training.noising.sample_block_noise`): a level t ~ U(eps, 1),
  every token masked with probability t, or with `--suffix S` that share of rows masked from a
  uniform cut to the end. `--max-level M` draws t ~ U(eps, M) (the trainer's `max_level`), from step
  `--max-level-from` on (1 before it), its bound rising from 2 eps to M over the first `--ramp` steps;
  with `--max-level-share P` only that share of rows (drawn row by row: the trainer's
  `max_level_share`), the rest from U(eps, 1), or with `--max-level-per step` that share of whole
  steps, spread evenly (the trainer's `max_level_per`; share 0.5: every other step).

It reports held-out accuracy of the signs in each mode as it trains: in block mode with every sign
masked and the rest of the row shown (chance 0.5):

    python benchmarks/check_noise_probe.py --noise checks|clover [--eps 0.1] [--max-level 1] [--suffix 0] [--steps 400]

About 0.1-0.2 s a step on one core (batch 64).
"""

import argparse
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from membership_probe import AND, ASK, DOT, NO, PROPERTIES, YES, small_model  # noqa: E402

from clover.training.noising import LEVEL_UNITS, noise_generator, sample_block_noise, step_level_bounds  # noqa: E402

EQUALS, COMMA = AND, DOT  # any two fixed one-token words serve
PLUS, MINUS = YES, NO
CHECKS = 4  # per row
SIGNS = torch.tensor([4 + 5 * k for k in range(CHECKS)])  # positions of the signs in a row


def sample(rng: random.Random) -> list[int]:
    """One row: `? A=B+, C=D-, ...` (the sign glued to its pair)."""
    tokens = [ASK]
    for _ in range(CHECKS):
        a = rng.choice(PROPERTIES)
        b = a if rng.random() < 0.5 else rng.choice([p for p in PROPERTIES if p != a])
        tokens += [a, EQUALS, b, PLUS if a == b else MINUS, COMMA]
    return tokens


def batch(rng: random.Random, n: int) -> torch.Tensor:
    return torch.tensor([sample(rng) for _ in range(n)])  # [n, 1 + 5 * CHECKS]


def block_noise(ids: torch.Tensor, noise: str, eps: float, suffix: float,
                generator: torch.Generator, max_level: float = 1.0,
                max_level_share: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(masked [n, L] bool, level t [n, 1]) over the block (every token after the first)."""
    n, length = ids.shape
    if noise == "checks":
        signs = torch.rand(n, CHECKS, generator=generator) < 0.5
        signs[~signs.any(-1), 0] = True
        masked = torch.zeros(n, length, dtype=torch.bool)
        masked[:, SIGNS] = signs
        return masked, torch.full((n, 1), 0.5)
    targets = torch.ones(n, length - 1, dtype=torch.bool)
    drawn = sample_block_noise(targets, length - 1, eps, generator, suffix, max_level, max_level_share)
    return torch.cat((torch.zeros(n, 1, dtype=torch.bool), drawn.masked), dim=1), drawn.levels


def highest_level(step: int, max_level: float, ramp: int, eps: float) -> float:
    """The highest noise level at `step` (counted from where `max_level` starts): 1 before it, then
    rising linearly from 2 eps to `max_level` over `ramp` steps, then `max_level`."""
    if step < 0:
        return 1.0
    return max_level if step >= ramp else 2 * eps + (max_level - 2 * eps) * step / ramp


def losses(model, ids: torch.Tensor, masked: torch.Tensor, level: torch.Tensor,
           signs_only: bool = False) -> torch.Tensor:
    """Clover's two losses on rows that are one block after their first token; with `signs_only`
    the block loss counts the masked signs alone."""
    ar = model(ids).logits[:, :-1]
    l_ar = F.cross_entropy(ar.flatten(0, 1), ids[:, 1:].flatten())
    noisy = ids.masked_fill(masked, model.config.mask_token_id)
    block = model(noisy, block_len=ids.shape[1] - 1).logits
    ce = F.cross_entropy(block.flatten(0, 1), ids.flatten(), reduction="none").view(ids.shape)
    if signs_only:
        masked = masked & torch.isin(torch.arange(ids.shape[1]), SIGNS)
    l_diff = (ce * masked / level).sum() / (ids.shape[0] * (ids.shape[1] - 1))
    return l_ar + l_diff


def sign_accuracy(model, ids: torch.Tensor) -> tuple[float, float]:
    """(AR, block mode with every sign masked): share of signs predicted right."""
    with torch.no_grad():
        ar = model(ids).logits[:, SIGNS - 1].argmax(-1)
        noisy = ids.clone()
        noisy[:, SIGNS] = model.config.mask_token_id
        block = model(noisy, block_len=ids.shape[1] - 1).logits[:, SIGNS].argmax(-1)
    signs = ids[:, SIGNS]
    return (ar == signs).float().mean().item(), (block == signs).float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--noise", choices=("checks", "clover"), default="clover")
    parser.add_argument("--eps", type=float, default=0.1, help="clover noise: the lowest level t")
    parser.add_argument("--max-level", type=float, default=1.0, help="clover noise: the highest level t")
    parser.add_argument("--max-level-share", type=float, default=1.0,
                        help="clover noise: the share of rows whose level --max-level bounds (others U(eps, 1))")
    parser.add_argument("--max-level-per", choices=LEVEL_UNITS, default="block",
                        help="clover noise: --max-level-share counts rows (each one block) or whole steps")
    parser.add_argument("--ramp", type=int, default=0,
                        help="clover noise: raise the highest level linearly from 2 eps to --max-level over these steps")
    parser.add_argument("--max-level-from", type=int, default=0,
                        help="clover noise: the step --max-level (and --ramp) starts at; before it the highest level is 1")
    parser.add_argument("--suffix", type=float, default=0.0, help="clover noise: share of suffix-masked rows")
    parser.add_argument("--signs-only", action="store_true", help="block loss on the masked signs alone")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--every", type=int, default=50, help="steps between held-out reports")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = small_model(args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.95))
    held_out = batch(random.Random(12345), 512)
    rng, start = random.Random(args.seed + 1), time.time()
    noise = args.noise if args.noise == "checks" else (
        f"clover (eps {args.eps}, max level {args.max_level} on a share {args.max_level_share} of "
        f"{args.max_level_per}s from step {args.max_level_from}, ramp {args.ramp}, suffix {args.suffix})")
    noise += ", block loss on the signs alone" if args.signs_only else ""
    print(f"noise {noise}, seed {args.seed}, lr {args.lr}, batch 64, {args.threads} thread(s); "
          f"held-out: 512 rows of {CHECKS} signs, every sign masked in block mode")
    for step in range(1, args.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = args.lr * min(1.0, step / 20)
        ids = batch(rng, 64)
        highest = highest_level(step - args.max_level_from, args.max_level, args.ramp, args.eps)
        max_level, share = step_level_bounds(step, highest, args.max_level_share, args.max_level_per)
        masked, level = block_noise(ids, args.noise, args.eps, args.suffix, noise_generator(args.seed, step),
                                    max_level, share)
        loss = losses(model, ids, masked, level, args.signs_only)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % args.every == 0:
            ar, block = sign_accuracy(model, held_out)
            print(f"step {step:>5}  loss {loss.item():.3f}  AR {ar:.3f}  block {block:.3f}"
                  f"  ({time.time() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
