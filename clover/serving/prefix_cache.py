"""Prefix caching: the prompt's cache at page boundaries, reused by later requests that share it.

A page is `page` prompt tokens ending at a multiple of `page` (prompt pieces end on that grid,
`clover.model.decode_batch.prompt_piece_end`). An entry, keyed by the hash chain of the token
prefix up to its boundary, holds that page's attention keys/values and the GDN conv/recurrent
states at the boundary (the recurrent state summarises everything before, so it cannot be shared
across pages). A hit on pages 1..k is written into the request's empty cache (its pool slot, in
place: one copy at admission), so only the suffix is prefilled. Entries are evicted least recently used first once
their bytes pass `budget_bytes`; a chain with an evicted page stops hitting at that page.

Contract: owned by the engine thread. Stored tensors are copies: no request's cache is pinned.
"""

from collections import OrderedDict
from dataclasses import dataclass

import torch

from clover.model import CloverCache
from clover.model.cache import AttentionLayerCache


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
