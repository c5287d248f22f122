"""Layer caches behind a plain handle, so FSDP2 leaves them alone.

FSDP2 walks a sharded module's inputs for tensors that need gradients and, for a dataclass
holding one, passes the module a rebuilt copy. The per-layer caches are dataclasses that the
layer updates in place (causal tokens append), and in training their tensors carry gradients
from the previous forward: the layer would update the copy and the next forward would miss the
appended keys. A handle (not a dataclass) forwards every read and write to the real cache.
"""


class LayerCacheHandle:
    __slots__ = ("_inner",)

    def __init__(self, inner):
        object.__setattr__(self, "_inner", inner)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __setattr__(self, name, value):
        setattr(self._inner, name, value)


def unwrap(cache):
    """The real layer cache behind a handle (or the argument itself)."""
    return cache._inner if isinstance(cache, LayerCacheHandle) else cache


def with_handles(cache):
    """`cache` (a `CloverCache`) with each layer cache behind a handle; returns it."""
    cache.layers = [LayerCacheHandle(layer) for layer in cache.layers]
    return cache
