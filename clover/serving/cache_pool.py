"""The cache pool: per-request caches allocated once, written in place, reused by later requests.

A slot is a pooled batch-1 `CloverCache` (`clover.model.cache`: attention keys/values in buffers
written in place, GDN states overwritten in place). A request takes a slot at admission and keeps
it for its whole life; a step's forward reads its rows' slots in place (`clover.model.cache_rows`),
so no step stacks, splits or concatenates cached keys. When the request leaves, the slot is
emptied (its buffers kept) and handed to the next request that fits in it.

Sizing: a slot's capacity is the positions its request needs (`cache_capacity`: prompt, every
block of the budget, two blocks of scratch) rounded up to a power of two, at most `slot_tokens`.
A request needing more than the free slots hold gets a free slot replaced by a larger one, so the
memory follows the longest requests the server has seen, not `slot_tokens` x slots. A request
needing more than `slot_tokens` is refused (`CacheCapacityError`).

Contract: owned by the engine thread; at most `num_slots` slots are taken at once.
"""

from clover.model import CloverCache
from clover.model.decode_batch import cache_capacity
from clover.model.generation_config import DecodeConfig

MIN_SLOT_TOKENS = 256


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
            cache = self.new_cache(min(self.slot_tokens, max(MIN_SLOT_TOKENS, 1 << (need - 1).bit_length())))
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
