"""Training batches: left-padded prompts, block-aligned EOS-padded responses (SPEC §8).

Blocks are aligned to the start of the response, as at inference: left-padding the prompts puts
every row's response at the same column, so block b is columns bB .. bB+B-1 for all rows.
A row's response (ending in EOS) is padded with EOS to a whole number of blocks and that padding
is a target; columns past the row's own last block (only there because a longer row needs them)
hold EOS too but are not targets.

`PairDataset` serves global batches by step number alone (a seeded permutation per epoch), so
the data position of a run is its step and resuming needs no iterator state.
"""

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Pair:
    """One (prompt, response) example as token ids; the response is what the model learns."""
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]


@dataclass(frozen=True)
class Batch:
    prompt_ids: torch.Tensor  # [N, P], left-padded
    prompt_mask: torch.Tensor  # [N, P] long, 0 on padding
    response_ids: torch.Tensor  # [N, R], R a multiple of the block size
    target_mask: torch.Tensor  # [N, R] bool, the tokens that carry loss

    @property
    def num_targets(self) -> int:
        return int(self.target_mask.sum())

    @property
    def num_tokens(self) -> int:
        """Real tokens of the clean sequences (prompt + targeted response)."""
        return int(self.prompt_mask.sum()) + self.num_targets

    def to(self, device) -> "Batch":
        return Batch(*(t.to(device) for t in (self.prompt_ids, self.prompt_mask, self.response_ids,
                                              self.target_mask)))


def blocked_response(response: Sequence[int], block_size: int, eos_id: int, eos_ids=(),
                     max_len: int | None = None) -> list[int]:
    """Truncate to `max_len`, end with EOS (appended unless the last token is one of
    `eos_ids`), then pad with `eos_id` to a whole number of blocks."""
    out = list(response)[:max_len] if max_len else list(response)
    if not out or out[-1] not in (set(eos_ids) | {eos_id}):
        out.append(eos_id)
    return out + [eos_id] * (-len(out) % block_size)


def collate(pairs: Sequence[Pair], block_size: int, eos_id: int, pad_id: int, eos_ids=(),
            max_prompt_len: int | None = None, max_response_len: int | None = None) -> Batch:
    """Left-pad prompts with `pad_id` (keeping the last `max_prompt_len` tokens) and block-pad
    responses with `eos_id`."""
    if not pairs:
        raise ValueError("cannot collate an empty batch")
    prompts = [list(p.prompt_ids)[-max_prompt_len:] if max_prompt_len else list(p.prompt_ids)
               for p in pairs]
    if any(not p for p in prompts):
        raise ValueError("every example needs a non-empty prompt")
    responses = [blocked_response(p.response_ids, block_size, eos_id, eos_ids, max_response_len)
                 for p in pairs]
    plen, rlen = max(map(len, prompts)), max(map(len, responses))
    prompt_ids = torch.full((len(pairs), plen), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros(len(pairs), plen, dtype=torch.long)
    response_ids = torch.full((len(pairs), rlen), eos_id, dtype=torch.long)
    target_mask = torch.zeros(len(pairs), rlen, dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        prompt_ids[i, plen - len(p):] = torch.tensor(p)
        prompt_mask[i, plen - len(p):] = 1
        response_ids[i, :len(r)] = torch.tensor(r)
        target_mask[i, :len(r)] = True
    return Batch(prompt_ids, prompt_mask, response_ids, target_mask)


@dataclass(frozen=True)
class BatchSpec:
    """How pairs become batches (shared by training and evaluation)."""
    block_size: int
    eos_id: int
    pad_id: int
    eos_ids: tuple[int, ...] = ()
    max_prompt_len: int | None = None
    max_response_len: int | None = None

    def collate(self, pairs: Sequence[Pair]) -> Batch:
        return collate(pairs, self.block_size, self.eos_id, self.pad_id, self.eos_ids,
                       self.max_prompt_len, self.max_response_len)


class PairDataset:
    """Global batches of `batch_size` pairs, addressed by step; each rank takes its own slice.

    `source` is a sequence of pairs or a callable `index -> Pair` (an endless stream, e.g. a
    seeded task generator). A sequence is visited in a fresh seeded order each epoch, as
    `len(source) // batch_size` whole batches (the remainder waits for a later epoch's order).
    With `group_by_length`, each window of `length_window` batches is sorted by length before it
    is cut into batches (whose order is then shuffled): rows of a batch have similar lengths, so
    few blocks are computed only as padding.
    """

    def __init__(self, source: Sequence[Pair] | Callable[[int], Pair], spec: BatchSpec,
                 batch_size: int, seed: int = 0, group_by_length: bool = False, length_window: int = 32):
        if batch_size <= 0:
            raise ValueError(f"batch_size={batch_size} must be positive")
        if not callable(source) and len(source) < batch_size:
            raise ValueError(f"the training set has {len(source)} examples, "
                             f"fewer than batch_size={batch_size}")
        self.source, self.spec, self.batch_size, self.seed = source, spec, batch_size, seed
        self.group_by_length, self.length_window = group_by_length, length_window
        self._epoch: tuple[int, list[list[int]]] | None = None

    @property
    def batches_per_epoch(self) -> int | None:
        return None if callable(self.source) else len(self.source) // self.batch_size

    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        if self._epoch is None or self._epoch[0] != epoch:  # only the current epoch is kept
            rng = random.Random(f"epoch|{self.seed}|{epoch}")
            order = list(range(len(self.source)))
            rng.shuffle(order)
            order = order[:self.batches_per_epoch * self.batch_size]
            if self.group_by_length:
                size = self.batch_size * self.length_window
                order = [i for w in range(0, len(order), size)
                         for i in sorted(order[w:w + size], key=self._length)]
            batches = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
            if self.group_by_length:
                rng.shuffle(batches)
            self._epoch = (epoch, batches)
        return self._epoch[1]

    def _length(self, index: int) -> tuple[int, int]:
        pair = self.source[index]
        return len(pair.response_ids), len(pair.prompt_ids)

    def indices(self, step: int) -> list[int]:
        """Source indices of global batch `step`."""
        if callable(self.source):
            return list(range(step * self.batch_size, (step + 1) * self.batch_size))
        epoch, position = divmod(step, self.batches_per_epoch)
        return self._epoch_batches(epoch)[position]

    def rank_slice(self, rank: int, world_size: int) -> range:
        """The positions of a global batch that a rank trains on (contiguous, balanced)."""
        if self.batch_size % world_size:
            raise ValueError(f"batch_size={self.batch_size} must be divisible by world size {world_size}")
        per = self.batch_size // world_size
        return range(rank * per, (rank + 1) * per)

    def batch(self, step: int, rank: int = 0, world_size: int = 1) -> Batch:
        """The rank's part of global batch `step` (0-based)."""
        indices = self.indices(step)
        get = self.source if callable(self.source) else self.source.__getitem__
        return self.spec.collate([get(indices[i]) for i in self.rank_slice(rank, world_size)])
