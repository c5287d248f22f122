"""Activation checkpointing per decoder layer: keep each layer's input, recompute its inside in
the backward pass (memory for activations drops from all of a layer's intermediates to its input).

A decoder layer writes its cache (causal tokens append), and the training loss runs several
forwards per backward on one cache, so a plain recompute would append twice and read a cache
that later forwards have already extended. Here the checkpointed function gets the layer cache's
tensors *before* the call as inputs and hands the new ones back as outputs: the recompute runs on
a private copy of the old state and leaves the real cache alone. Exact: the recomputed forward is
the same computation on the same inputs (the layers draw no random numbers).
"""

import types

import torch
from torch.utils.checkpoint import checkpoint

from .cache_handle import unwrap


def _layer_call(layer_forward, layer_cache):
    """A pure function of the cache's old tensors: (x, *old) -> (out, counts, *new)."""
    cls = None if layer_cache is None else type(layer_cache)
    names = () if layer_cache is None else tuple(layer_cache.tensors())

    def call(x, rotary, key_is_real, block_len, coreset_top_p, *old):
        private = None if cls is None else cls(**dict(zip(names, old)))
        out, counts = layer_forward(x, rotary, key_is_real, private, block_len, coreset_top_p)
        new = () if private is None else tuple(private.tensors().values())
        return (out, counts, *new)

    return call, names


def checkpointed_forward(self, x, rotary, key_is_real, cache, block_len, coreset_top_p):
    if not torch.is_grad_enabled():  # evaluation: nothing to save
        return self._unchecked_forward(x, rotary, key_is_real, cache, block_len, coreset_top_p)
    cache = unwrap(cache)
    call, names = _layer_call(self._unchecked_forward, cache)
    old = () if cache is None else tuple(cache.tensors().values())
    out, counts, *new = checkpoint(call, x, rotary, key_is_real, block_len, coreset_top_p, *old,
                                   use_reentrant=False)
    for name, tensor in zip(names, new):
        setattr(cache, name, tensor)
    return out, counts


def checkpoint_layers(model: torch.nn.Module) -> int:
    """Checkpoint every decoder layer of a `CloverMoeForCausalLM` (in place, state-dict names
    unchanged); returns how many layers. Apply before FSDP sharding."""
    layers = model.model.layers
    for layer in layers:
        if not hasattr(layer, "_unchecked_forward"):
            layer._unchecked_forward = layer.forward
            layer.forward = types.MethodType(checkpointed_forward, layer)
    return len(layers)
