"""One batched forward over rows whose caches live apart (the server's cache-pool slots).

Each row keeps its own pooled batch-1 `CloverCache` (`CloverCache(..., capacity=N)`), reused for
the request's whole life; a forward over G such rows reads them in place:

* attention: each row's new keys/values are written into its own buffer right after its cached
  positions and the row attends over a view of that buffer (`GatedAttention`'s row path): no
  padding, no copy or concatenation of cached keys;
* GDN: the rows' conv/recurrent states are gathered into [G, ...] (a copy of fixed size per
  layer, independent of the context length); the new states are written back into each row's
  storage, in place, by `commit`.

Contract: pass a `RowsCache` as `past_key_values` with `attention_mask` [G, past + T], where
`past = get_seq_length()` (the longest row) and the first `past` columns are `key_mask()` (shorter
rows left-padded), and row r's new tokens left-padded by `pads[r]`. Rows that append causal tokens
must be empty or all append the same number (padding must not sit between real GDN inputs). The
forward changes no row's cache: only scratch positions past each row's length are written, and GDN
states are held back. `commit(appended)` then makes each row's first `appended[r]` new tokens
part of its cache (a row with 0 keeps its cache as it was, GDN states included: a rejected
self-speculative verify); a forward that failed is simply not committed.
"""

import torch

from .cache import AttentionLayerCache, CloverCache, GatedDeltaNetLayerCache


class AttentionRows:
    """One attention layer of G rows, each in its own pooled `AttentionLayerCache`."""

    def __init__(self, layers: list[AttentionLayerCache], pads: list[int]):
        self.layers, self.pads = layers, pads

    def read(self, key: torch.Tensor, value: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """key/value [G, H_kv, T, D] -> per row (keys, values) [1, H_kv, L_r + T - pads[r], D]:
        views of the row's buffer, its cached positions then its new ones (written past L_r)."""
        return [layer.read(key[r:r + 1, :, pad:], value[r:r + 1, :, pad:])
                for r, (layer, pad) in enumerate(zip(self.layers, self.pads))]

    def commit(self, appended: list[int]) -> None:
        for layer, num in zip(self.layers, appended):
            layer.advance(num)


class GatedDeltaNetRows:
    """One GDN layer of G rows: `conv_state` / `recurrent_state` read like a batched layer cache
    ([G, ...], None when every row is empty); `write` holds the new states until `commit`."""

    def __init__(self, layers: list[GatedDeltaNetLayerCache]):
        self.layers = layers
        self.conv_state, self.recurrent_state = self._gather("conv_state"), self._gather("recurrent_state")
        self._new: tuple[torch.Tensor, torch.Tensor] | None = None

    def _gather(self, name: str) -> torch.Tensor | None:
        states = [getattr(layer, name) for layer in self.layers]
        present = next((s for s in states if s is not None), None)
        if present is None:
            return None
        return torch.cat([present.new_zeros(present.shape) if s is None else s for s in states])

    def write(self, conv_state: torch.Tensor, recurrent_state: torch.Tensor) -> None:
        self._new = (conv_state, recurrent_state)

    def commit(self, appended: list[int]) -> None:
        if self._new is None:
            return
        conv, recurrent = self._new
        for r, (layer, num) in enumerate(zip(self.layers, appended)):
            if num:  # a row that keeps none of its new tokens keeps its state (a rejected verify)
                layer.write(conv[r:r + 1], recurrent[r:r + 1])  # pooled: copied into the row's own storage
        self._new = None


class RowsCache:
    """The `past_key_values` of a forward over rows that each own a pooled batch-1 cache."""

    def __init__(self, caches: list[CloverCache], pads: list[int]):
        if any(not c.capacity for c in caches):
            raise ValueError("RowsCache reads pooled caches in place; a growing cache has no buffer to write")
        self.caches = caches
        self.past = max(c.seq_length for c in caches)
        self.seq_length = self.past  # the model's counter of appended tokens; `commit` decides per row
        self.layers = [AttentionRows([c.layers[i] for c in caches], pads)
                       if isinstance(layer, AttentionLayerCache)
                       else GatedDeltaNetRows([c.layers[i] for c in caches])
                       for i, layer in enumerate(caches[0].layers)]

    def get_seq_length(self) -> int:
        return self.past

    def key_mask(self, device) -> torch.Tensor:
        """[G, get_seq_length()] long: 1 on each row's cached positions, right-aligned."""
        lengths = torch.tensor([c.seq_length for c in self.caches], device=device)
        return (torch.arange(self.past, device=device) >= self.past - lengths[:, None]).long()

    def commit(self, appended: list[int]) -> None:
        """Row r's first `appended[r]` new tokens (after its padding) join its cache."""
        for layer in self.layers:
            layer.commit(appended)
        for cache, num in zip(self.caches, appended):
            cache.seq_length += num
