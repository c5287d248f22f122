"""Typed per-layer caches. Contract: causal tokens append, block tokens never write (SPEC C2, C3).

The model owns the layout; callers own the cache object and may `clone`, `crop` (attention only,
for rollback), `select_rows` (drop finished batch rows) or `snapshot`/`restore` it between forwards.
"""

from dataclasses import dataclass

import torch


@dataclass
class AttentionLayerCache:
    key: torch.Tensor | None = None  # [B, H_kv, T, D]
    value: torch.Tensor | None = None  # [B, H_kv, T, D]

    def read(self, key: torch.Tensor, value: torch.Tensor):
        """Cached keys/values followed by the new ones; does not write."""
        if self.key is None:
            return key, value
        return torch.cat((self.key, key), dim=2), torch.cat((self.value, value), dim=2)

    def append(self, key: torch.Tensor, value: torch.Tensor) -> None:
        self.key, self.value = self.read(key, value)

    def keep(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        """Store the first `length` positions of keys/values that `read` returned (no copy)."""
        self.key, self.value = keys[:, :, :length], values[:, :, :length]

    @property
    def length(self) -> int:
        return 0 if self.key is None else self.key.shape[2]

    def crop(self, length: int) -> None:
        if self.key is not None:
            self.key, self.value = self.key[:, :, :length], self.value[:, :, :length]

    def tensors(self):
        return {"key": self.key, "value": self.value}


@dataclass
class GatedDeltaNetLayerCache:
    conv_state: torch.Tensor | None = None  # [B, conv_dim, K-1]: the last K-1 conv inputs
    recurrent_state: torch.Tensor | None = None  # [B, H_v, d_k, d_v], fp32

    @property
    def length(self) -> int:
        return 0

    def crop(self, length: int) -> None:
        raise NotImplementedError("a recurrent state cannot be cropped: restore a snapshot instead")

    def tensors(self):
        return {"conv_state": self.conv_state, "recurrent_state": self.recurrent_state}


class CloverCache:
    """The decoding state of every layer plus the number of cached positions (padding included)."""

    def __init__(self, layer_types: list[str]):
        self.layers = [AttentionLayerCache() if kind == "full_attention" else GatedDeltaNetLayerCache()
                       for kind in layer_types]
        self.seq_length = 0

    def get_seq_length(self) -> int:
        return self.seq_length

    def _map(self, fn) -> "CloverCache":
        new = CloverCache.__new__(CloverCache)
        new.seq_length = self.seq_length
        new.layers = [type(layer)(**{name: None if t is None else fn(t) for name, t in layer.tensors().items()})
                      for layer in self.layers]
        return new

    def clone(self) -> "CloverCache":
        return self._map(lambda t: t.clone())

    def snapshot(self) -> "CloverCache":
        """A copy that shares attention tensors (they are only ever replaced, never written in place)."""
        return self._map(lambda t: t)

    def select_rows(self, rows: torch.Tensor) -> "CloverCache":
        return self._map(lambda t: t.index_select(0, rows.to(t.device)))

    def crop_attention(self, length: int) -> None:
        """Drop cached attention positions past `length` (the GDN state must be restored separately)."""
        for layer in self.layers:
            if isinstance(layer, AttentionLayerCache):
                layer.crop(length)
        self.seq_length = length

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.layers
                   for t in layer.tensors().values() if t is not None)
