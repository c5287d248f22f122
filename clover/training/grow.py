"""Growth of a trained model, in depth (block expansion) or in attention heads, into a larger model
that computes exactly what its init computes.

`grow_layers(model, after)` inserts, right after each layer index in `after`, a copy of that layer
whose writes to the residual stream are zero: the mixer's output projection (attention `o_proj`,
GDN `out_proj`) and the MoE's down projections (routed experts and shared expert). Every layer
adds its output to the residual stream, so the grown model's logits equal the init's in causal and
block mode. Training moves the zeroed projections first (their gradients are the copy's own
activations, which are the trained layer's features); the rest of the copy follows.

This is how a trained small model gains capacity without starting over (as in LLaMA Pro's block
expansion): recipe key `model.grow_after` with `model.init`.

`grow_heads(model, extra)` adds `extra` query heads (and `extra / group` key-value heads, keeping
the grouped-query ratio) to every full-attention layer. The new heads start fresh (the model's own
init, from a fixed seed, so that sibling runs share them) and write nothing yet: their columns of
`o_proj` are zero. They are the capacity for lookups that the old heads share: recipe key
`model.grow_heads` with `model.init`.
"""

import copy
from collections.abc import Sequence

import torch

# Parameters (relative to a layer) that write into the residual stream.
RESIDUAL_WRITES = ("self_attn.o_proj.weight", "linear_attn.out_proj.weight",
                   "mlp.experts.down_proj", "mlp.shared_expert.down_proj.weight")


def layer_sources(num_layers: int, after: Sequence[int]) -> list[tuple[int, bool]]:
    """For each layer of the grown model: (the init's layer it copies, whether it is a new copy)."""
    bad = sorted(i for i in after if not 0 <= i < num_layers)
    if bad:
        raise ValueError(f"grow_after={list(after)}: layer index(es) {bad} outside 0..{num_layers - 1}")
    if len(set(after)) != len(after):
        raise ValueError(f"grow_after={list(after)} names a layer twice")
    sources = []
    for i in range(num_layers):
        sources.append((i, False))
        if i in after:
            sources.append((i, True))
    return sources


def grown_config(config, after: Sequence[int]):
    """`config` with a copy of each layer in `after` inserted after it."""
    sources = layer_sources(config.num_hidden_layers, after)
    grown = copy.deepcopy(config)
    grown.layer_types = [config.layer_types[i] for i, _ in sources]
    grown.num_hidden_layers = len(sources)
    return grown


@torch.no_grad()
def grow_layers(model, after: Sequence[int]):
    """A new model: `model` with a residual-silent copy of each layer in `after` inserted after it
    (same dtype and device; `model` itself is left as it was, and returned when `after` is empty)."""
    if not after:
        return model
    sources = layer_sources(model.config.num_hidden_layers, after)
    old = model.state_dict()
    state = {k: v for k, v in old.items() if not k.startswith("model.layers.")}
    for j, (i, is_copy) in enumerate(sources):
        prefix = f"model.layers.{i}."
        for key, value in old.items():
            if key.startswith(prefix):
                name = key[len(prefix):]
                silent = is_copy and name in RESIDUAL_WRITES
                state[f"model.layers.{j}.{name}"] = torch.zeros_like(value) if silent else value.clone()
    grown = type(model)(grown_config(model.config, after))
    grown.load_state_dict(state, strict=True)
    return like(grown, model)


def like(grown, model):
    """`grown` with `model`'s generation config, on its device and in its dtype."""
    grown.generation_config = copy.deepcopy(model.generation_config)
    return grown.to(device=next(model.parameters()).device, dtype=next(model.parameters()).dtype)


def widened_config(config, extra_heads: int):
    """`config` with `extra_heads` more query heads per attention layer (and the key-value heads
    that keep their ratio)."""
    group = config.num_attention_heads // config.num_key_value_heads
    if extra_heads < 0 or extra_heads % group:
        raise ValueError(f"grow_heads={extra_heads} must be a non-negative multiple of the "
                         f"{group} query heads that share a key-value head")
    widened = copy.deepcopy(config)
    widened.num_attention_heads += extra_heads
    widened.num_key_value_heads += extra_heads // group
    return widened


@torch.no_grad()
def grow_heads(model, extra_heads: int, seed: int = 0):
    """A new model: `model` with `extra_heads` residual-silent fresh query heads per attention
    layer (`model` is left as it was, and returned when `extra_heads` is 0)."""
    if not extra_heads:
        return model
    with torch.random.fork_rng(devices=[]):  # the caller's random stream goes on as if not called
        torch.manual_seed(seed)
        wide = type(model)(widened_config(model.config, extra_heads))
    state = wide.state_dict()  # the wide model's own tensors: writing them writes the model
    for key, value in model.state_dict().items():
        # Old heads come first along every widened dim: q_proj rows [H * (query D, gate D)], k_proj
        # and v_proj rows [H_kv * D], o_proj columns [H * D]; every other tensor keeps its shape.
        state[key][tuple(slice(0, n) for n in value.shape)] = value
        if key.endswith("self_attn.o_proj.weight"):  # the new heads' columns write nothing
            state[key][:, value.shape[1]:] = 0
    return like(wide, model)
