"""Typed per-layer caches. Contract: causal tokens append, block tokens never write (SPEC C2, C3).

Two storage modes, one interface:

* growing (`CloverCache(layer_types)`): each causal append replaces the tensors by a
  concatenation. Nothing is written in place, so autograd can back-propagate through the cache
  (training, `clover/training/loss.py`).
* pooled (`CloverCache(layer_types, capacity=N)`): attention keys/values live in buffers of N
  positions allocated at the first forward and written in place; forwards read views of the first
  `length` positions; GDN conv/recurrent states are overwritten in place. No per-step concatenation
  or copy (inference only: an in-place write would invalidate autograd's saved tensors).

The model owns the layout; callers own the cache object and may `clone`, `select_rows` (drop
finished batch rows), `snapshot` / `restore` (GDN states copied, attention by length) or
`crop_attention` between forwards. Block positions written past `length` of a pooled buffer are
scratch: `length` never covers them.

One batched forward over rows whose caches live apart (the server's cache-pool slots).

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

from dataclasses import dataclass

import torch

@dataclass
class AttentionLayerCache:
    key: torch.Tensor | None = None  # [B, H_kv, T, D] the cached positions (a view of the buffer when pooled)
    value: torch.Tensor | None = None  # [B, H_kv, T, D]
    capacity: int = 0  # pooled: positions of the buffers (0 = growing)
    key_buffer: torch.Tensor | None = None  # [B, H_kv, capacity, D]
    value_buffer: torch.Tensor | None = None  # [B, H_kv, capacity, D]

    def read(self, key: torch.Tensor, value: torch.Tensor):
        """Cached keys/values followed by the new ones. Growing: a concatenation; pooled: the new
        ones are written past `length` and views are returned (`length` is unchanged)."""
        if self.capacity:
            return self._read_pooled(key, value)
        if self.key is None:
            return key, value
        return torch.cat((self.key, key), dim=2), torch.cat((self.value, value), dim=2)

    def _read_pooled(self, key: torch.Tensor, value: torch.Tensor):
        past = self.length
        end = past + key.shape[2]
        if end > self.capacity:
            raise ValueError(f"the cache holds {self.capacity} positions; this forward needs {end} "
                             f"(cached {past} + new {key.shape[2]})")
        if self.key_buffer is None:
            shape = (key.shape[0], key.shape[1], self.capacity, key.shape[3])
            self.key_buffer = key.new_empty(shape)
            self.value_buffer = value.new_empty(shape)
        self.key_buffer[:, :, past:end] = key
        self.value_buffer[:, :, past:end] = value
        return self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]

    def append(self, key: torch.Tensor, value: torch.Tensor) -> None:
        keys, values = self.read(key, value)
        self.keep(keys, values, keys.shape[2])

    def keep(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        """Store the first `length` positions of keys/values that `read` returned (no copy)."""
        self.key, self.value = keys[:, :, :length], values[:, :, :length]

    @property
    def length(self) -> int:
        return 0 if self.key is None else self.key.shape[2]

    def advance(self, num: int) -> None:
        """Pooled: cover `num` more positions, which `read` has already written past `length`."""
        if self.key_buffer is not None:
            end = self.length + num
            self.key, self.value = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]

    def crop(self, length: int) -> None:
        if self.key is not None:
            self.key, self.value = self.key[:, :, :length], self.value[:, :, :length]

    def tensors(self):
        return {"key": self.key, "value": self.value}

    def storage(self) -> list:
        """The tensors that hold memory: the whole buffers when pooled, else the cached positions."""
        return [self.key_buffer, self.value_buffer] if self.key_buffer is not None else [self.key, self.value]

    def mapped(self, fn) -> "AttentionLayerCache":
        """A cache with `fn` applied to its storage (buffers when pooled), same length."""
        if self.key_buffer is None:
            return AttentionLayerCache(*(None if t is None else fn(t) for t in (self.key, self.value)),
                                       capacity=self.capacity)
        new = AttentionLayerCache(capacity=self.capacity, key_buffer=fn(self.key_buffer),
                                  value_buffer=fn(self.value_buffer))
        new.key, new.value = new.key_buffer[:, :, :self.length], new.value_buffer[:, :, :self.length]
        return new


@dataclass
class GatedDeltaNetLayerCache:
    conv_state: torch.Tensor | None = None  # [B, conv_dim, K-1]: the last K-1 conv inputs
    recurrent_state: torch.Tensor | None = None  # [B, H_v, d_k, d_v], fp32
    in_place: bool = False  # pooled: overwrite the states in place (inference only)

    @property
    def length(self) -> int:
        return 0

    def write(self, conv_state: torch.Tensor, recurrent_state: torch.Tensor) -> None:
        """Pooled: copied into this layer's own storage (a copy of the first write becomes it), so
        the caller's tensors are never kept; growing: the tensors are kept (never written in place)."""
        if not self.in_place:
            self.conv_state, self.recurrent_state = conv_state, recurrent_state
        elif self.conv_state is None:
            self.conv_state, self.recurrent_state = conv_state.clone(), recurrent_state.clone()
        else:
            self.conv_state.copy_(conv_state)
            self.recurrent_state.copy_(recurrent_state)

    def clear(self) -> None:
        """The empty-cache state: zeros (in place when pooled, so the storage is reused)."""
        if self.in_place and self.conv_state is not None:
            self.conv_state.zero_()
            self.recurrent_state.zero_()
        else:
            self.conv_state = self.recurrent_state = None

    def crop(self, length: int) -> None:
        raise NotImplementedError("a recurrent state cannot be cropped: restore a snapshot instead")

    def tensors(self):
        return {"conv_state": self.conv_state, "recurrent_state": self.recurrent_state}

    def storage(self) -> list:
        return [self.conv_state, self.recurrent_state]

    def mapped(self, fn) -> "GatedDeltaNetLayerCache":
        return GatedDeltaNetLayerCache(*(None if t is None else fn(t) for t in self.tensors().values()),
                                       in_place=self.in_place)


class CloverCache:
    """The decoding state of every layer plus the number of cached positions (padding included).
    `capacity` > 0 makes a pooled cache of that many positions (see the module docstring)."""

    def __init__(self, layer_types: list[str], capacity: int = 0):
        self.layers = [AttentionLayerCache(capacity=capacity) if kind == "full_attention"
                       else GatedDeltaNetLayerCache(in_place=capacity > 0) for kind in layer_types]
        self.seq_length = 0
        self.capacity = capacity

    def get_seq_length(self) -> int:
        return self.seq_length

    def _map(self, fn, gdn_fn=None) -> "CloverCache":
        new = CloverCache.__new__(CloverCache)
        new.seq_length, new.capacity = self.seq_length, self.capacity
        new.layers = [layer.mapped(fn if isinstance(layer, AttentionLayerCache) or gdn_fn is None else gdn_fn)
                      for layer in self.layers]
        return new

    def clone(self) -> "CloverCache":
        return self._map(lambda t: t.clone())

    def snapshot(self) -> "CloverCache":
        """The state at this point, for `restore`: attention shares storage (positions below
        `seq_length` are never written again until a crop below them), GDN states are copied."""
        return self._map(lambda t: t, gdn_fn=lambda t: t.clone())

    def restore(self, snapshot: "CloverCache") -> None:
        """Roll back to `snapshot` of this cache: attention cropped to its length, GDN states copied
        back (in place when pooled)."""
        for layer, saved in zip(self.layers, snapshot.layers):
            if isinstance(layer, AttentionLayerCache):
                layer.crop(saved.length)
            elif saved.conv_state is not None:
                layer.write(saved.conv_state, saved.recurrent_state)  # pooled: copied in; growing: shared
        self.seq_length = snapshot.seq_length

    def reset(self) -> None:
        """Empty again, keeping a pooled cache's buffers for the next user (`serving.cache_pool`)."""
        self.crop_attention(0)
        for layer in self.layers:
            if isinstance(layer, GatedDeltaNetLayerCache):
                layer.clear()

    def select_rows(self, rows: torch.Tensor) -> "CloverCache":
        return self._map(lambda t: t.index_select(0, rows.to(t.device)))

    def crop_attention(self, length: int) -> None:
        """Drop cached attention positions past `length` (the GDN state must be restored separately)."""
        for layer in self.layers:
            if isinstance(layer, AttentionLayerCache):
                layer.crop(length)
        self.seq_length = length

    def nbytes(self) -> int:
        """Bytes held: cached positions (growing) or whole buffers (pooled)."""
        return sum(t.numel() * t.element_size() for layer in self.layers for t in layer.storage() if t is not None)


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
