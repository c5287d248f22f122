"""The engine's caches: per-request pool slots, the prefix cache, and the stacked caches and inputs of
one forward.

The cache pool: per-request caches allocated once, written in place, reused by later requests.

A slot is a pooled batch-1 `CloverCache` (`clover.model.cache`: attention keys/values in buffers
written in place, GDN states overwritten in place). A request takes a slot at admission and keeps
it for its whole life; a step's forward reads its rows' slots in place (`clover.model.cache`),
so no step stacks, splits or concatenates cached keys. When the request leaves, the slot is
emptied (its buffers kept) and handed to the next request that fits in it.

Sizing: a slot's capacity is the positions its request needs (`cache_capacity`: prompt, every
block of the budget, two blocks of scratch) rounded up on a grid of four sizes per power of two
(`slot_size`: at most 25% over the need), at most `slot_tokens`.
A request needing more than the free slots hold gets a free slot replaced by a larger one, so the
memory follows the longest requests the server has seen, not `slot_tokens` x slots. A request
needing more than `slot_tokens` is refused (`CacheCapacityError`).

Contract: owned by the engine thread; at most `num_slots` slots are taken at once.

Prefix caching: the prompt's cache at page boundaries, reused by later requests that share it.

A page is `page` prompt tokens ending at a multiple of `page` (prompt pieces end on that grid,
`clover.model.generation_batch.prompt_piece_end`). An entry, keyed by the hash chain of the token
prefix up to its boundary, holds that page's attention keys/values and the GDN conv/recurrent
states at the boundary (the recurrent state summarises everything before, so it cannot be shared
across pages). A hit on pages 1..k is written into the request's empty cache (its pool slot, in
place: one copy at admission), so only the suffix is prefilled. Entries are evicted least recently used first once
their bytes pass `budget_bytes`; a chain with an evicted page stops hitting at that page.

Contract: owned by the engine thread. Stored tensors are copies: no request's cache is pinned.

The rows of one forward: their inputs (`stack_inputs`, both paths) and, for the engine's plain
twin (`EngineConfig(cache_pool=False)`), per-request growing caches stacked into one batched cache
and split back after the forward (a copy of every row's cache per step; the cache pool reads
the rows in place instead, `clover.model.cache`).

Every row of a forward appends the same number of tokens, except prefill rows, whose caches are
empty: a prompt is left-padded, which is exact (padding keys are masked out, and a zero GDN input
leaves the zero state and conv context as they were). Cached prefixes of different lengths are
left-padded in the attention KV only; GDN states have no length. Padding never sits between real
tokens, so each row computes what it would compute alone (C4).
"""

from collections import OrderedDict
from dataclasses import dataclass

import torch

from clover.model import CloverCache
from clover.model.cache import AttentionLayerCache
from clover.model.generation_batch import cache_capacity
from clover.model.generation_config import DecodeConfig

@dataclass
class BatchedCache:
    cache: CloverCache  # batch G, left-padded to the longest row
    key_mask: torch.Tensor  # [G, T_cached] long, 0 on padding
    pads: list[int]  # per row: left padding in front of its cached keys


@dataclass
class BatchedInput:
    input_ids: torch.Tensor  # [G, T_new]: [left pad, causal tokens, block]
    new_mask: torch.Tensor  # [G, T_new] long, 0 on padding
    pads: list[int]  # per row: left padding in front of its causal tokens


def _left_pad_cat(tensors: list[torch.Tensor], length: int) -> torch.Tensor:
    """[1, H, L_i, D] each -> [G, H, length, D], each row right-aligned."""
    first = tensors[0]
    out = first.new_zeros(len(tensors), first.shape[1], length, first.shape[3])
    for row, t in enumerate(tensors):
        if t.shape[2]:
            out[row, :, length - t.shape[2]:] = t[0]
    return out


def stack_caches(caches: list[CloverCache], empty: CloverCache) -> BatchedCache:
    """One batched cache from per-request caches (batch 1 each); `empty` receives the tensors.
    The per-request caches are not modified."""
    length = max(c.seq_length for c in caches)
    for i, layer in enumerate(empty.layers):
        parts = [c.layers[i] for c in caches]
        if isinstance(layer, AttentionLayerCache):
            layer.key = _left_pad_cat([p.key for p in parts], length)
            layer.value = _left_pad_cat([p.value for p in parts], length)
        else:
            layer.conv_state = torch.cat([p.conv_state for p in parts])
            layer.recurrent_state = torch.cat([p.recurrent_state for p in parts])
    empty.seq_length = length
    pads = [length - c.seq_length for c in caches]
    device = next(t for t in empty.layers[0].tensors().values() if t is not None).device
    mask = torch.tensor([[0] * p + [1] * (length - p) for p in pads], dtype=torch.long, device=device)
    return BatchedCache(empty, mask, pads)


def split_cache(batched: CloverCache, starts: list[int], empties: list[CloverCache]) -> list[CloverCache]:
    """Row r of `batched` from key index `starts[r]` on, copied so that no row pins the batch."""
    for row, (start, cache) in enumerate(zip(starts, empties)):
        for layer, src in zip(cache.layers, batched.layers):
            if isinstance(layer, AttentionLayerCache):
                layer.key = src.key[row:row + 1, :, start:].clone()
                layer.value = src.value[row:row + 1, :, start:].clone()
            else:
                layer.conv_state = src.conv_state[row:row + 1].clone()
                layer.recurrent_state = src.recurrent_state[row:row + 1].clone()
        cache.seq_length = batched.seq_length - start
    return empties


def stack_inputs(causal: list[list[int]], blocks: list[torch.Tensor], pad_id: int, device) -> BatchedInput:
    """Rows `[left pad, causal_r, block_r]`; blocks share one length."""
    width = max(len(c) for c in causal)
    pads = [width - len(c) for c in causal]
    prefix = torch.tensor([[pad_id] * p + c for p, c in zip(pads, causal)], dtype=torch.long, device=device)
    ids = torch.cat((prefix.view(len(causal), width), torch.stack(blocks).to(device)), dim=1)
    mask = torch.ones_like(ids)
    for row, p in enumerate(pads):
        mask[row, :p] = 0
    return BatchedInput(ids, mask, pads)


MIN_SLOT_TOKENS = 256


def slot_size(need: int) -> int:
    """`need` positions rounded up to a multiple of an eighth of the power of two at or above it:
    four sizes per octave, so a slot is at most 25% larger than its request needs (a power of two
    was up to 2x), and freed slots still fit later requests of about the same length."""
    grain = 1 << max(0, (need - 1).bit_length() - 3)
    return -(-need // grain) * grain


class CacheCapacityError(ValueError):
    """A request that cannot get a cache slot; the message names the need and the limit."""


class CachePool:
    def __init__(self, new_cache, num_slots: int, slot_tokens: int):
        if num_slots <= 0 or slot_tokens <= 0:
            raise ValueError(f"a cache pool needs num_slots={num_slots} > 0 and slot_tokens={slot_tokens} > 0")
        self.new_cache, self.num_slots, self.slot_tokens = new_cache, num_slots, slot_tokens
        self.free: list[CloverCache] = []
        self.taken = 0

    def acquire(self, prompt_len: int, cfg: DecodeConfig) -> CloverCache:
        """An empty slot for a request with this prompt and settings."""
        need = self.check(prompt_len, cfg)
        if self.taken >= self.num_slots:
            raise CacheCapacityError(f"all {self.num_slots} cache slots are taken")
        fits = [c for c in self.free if c.capacity >= need]
        if fits:
            cache = min(fits, key=lambda c: c.capacity)
            self.free.remove(cache)
        else:
            if self.free and len(self.free) + self.taken >= self.num_slots:
                self.free.remove(min(self.free, key=lambda c: c.capacity))  # too small: replaced
            cache = self.new_cache(min(self.slot_tokens, max(MIN_SLOT_TOKENS, slot_size(need))))
        self.taken += 1
        return cache

    def check(self, prompt_len: int, cfg: DecodeConfig) -> int:
        """The positions the request needs; raises `CacheCapacityError` past `slot_tokens`."""
        need = cache_capacity(prompt_len, cfg)  # prompt, every block it may commit, scratch
        if need > self.slot_tokens:
            raise CacheCapacityError(
                f"the request needs {need} cache positions (prompt {prompt_len} + max_tokens "
                f"{cfg.max_new_tokens} in blocks of {cfg.block_size} + 2 blocks of scratch), more than "
                f"a cache slot's {self.slot_tokens} (--cache-slot-tokens)")
        return need

    def release(self, cache: CloverCache) -> None:
        """Give a slot back; it is emptied for the next request (buffers kept)."""
        cache.reset()
        self.free.append(cache)
        self.taken -= 1

    def nbytes(self) -> int:
        """Bytes of the free slots' buffers (taken slots are counted by their requests)."""
        return sum(c.nbytes() for c in self.free)


@dataclass
class PrefixEntry:
    tokens: tuple[int, ...]  # the page's tokens (checked on a hit: hashes may collide)
    layers: list[dict[str, torch.Tensor]]  # per layer: the page's key/value, or the GDN states
    nbytes: int


@dataclass
class PrefixHit:
    length: int  # prompt tokens cached (0 on a miss)
    pages: list[PrefixEntry]  # the pages of those tokens, in order


class PrefixCache:
    def __init__(self, budget_bytes: int, page: int):
        if page <= 0:
            raise ValueError(f"prefix cache page={page} must be a positive number of tokens")
        self.budget_bytes, self.page = budget_bytes, page
        self.entries: OrderedDict[int, PrefixEntry] = OrderedDict()
        self.nbytes = 0

    def _keys(self, prompt: list[int], limit: int):
        """(key, page tokens, page end) of every whole page ending at or before `limit`."""
        key = 0
        for end in range(self.page, limit + 1, self.page):
            tokens = tuple(prompt[end - self.page:end])
            key = hash((key, tokens))
            yield key, tokens, end

    def lookup(self, prompt: list[int]) -> PrefixHit:
        """The longest cached prefix that leaves at least one prompt token to prefill."""
        found = []
        for key, tokens, _ in self._keys(prompt, len(prompt) - 1):
            entry = self.entries.get(key)
            if entry is None or entry.tokens != tokens:
                break
            self.entries.move_to_end(key)
            found.append(entry)
        return PrefixHit(len(found) * self.page, found)

    def restore(self, hit: PrefixHit, cache: CloverCache) -> CloverCache:
        """Write a hit into an empty batch-1 `cache` (growing or pooled); returns it."""
        for i, layer in enumerate(cache.layers):
            if isinstance(layer, AttentionLayerCache):
                layer.append(torch.cat([p.layers[i]["key"] for p in hit.pages], dim=2),
                             torch.cat([p.layers[i]["value"] for p in hit.pages], dim=2))
            else:
                last = hit.pages[-1].layers[i]
                layer.write(last["conv_state"], last["recurrent_state"])  # a write copies (pooled) or replaces
        cache.seq_length = hit.length
        return cache

    def store(self, prompt: list[int], end: int, cache: CloverCache) -> None:
        """Record the page ending at `end` from a batch-1 cache holding exactly `end` positions
        (only when every earlier page is cached, so the entry can ever hit)."""
        if end % self.page or cache.get_seq_length() != end or self.budget_bytes <= 0:
            return
        chain = list(self._keys(prompt, end))
        if any(k not in self.entries for k, _, _ in chain[:-1]):
            return
        key, tokens, _ = chain[-1]
        if key in self.entries:
            self.entries.move_to_end(key)
            return
        layers, nbytes = [], 0
        for layer in cache.layers:
            if isinstance(layer, AttentionLayerCache):
                saved = {"key": layer.key[:, :, end - self.page:end].clone(),
                         "value": layer.value[:, :, end - self.page:end].clone()}
            else:
                saved = {"conv_state": layer.conv_state.clone(), "recurrent_state": layer.recurrent_state.clone()}
            layers.append(saved)
            nbytes += sum(t.numel() * t.element_size() for t in saved.values())
        self.entries[key] = PrefixEntry(tokens, layers, nbytes)
        self.nbytes += nbytes
        while self.nbytes > self.budget_bytes and self.entries:
            _, old = self.entries.popitem(last=False)
            self.nbytes -= old.nbytes
