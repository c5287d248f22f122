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

`grow_heads(model, extra, split=True)` starts the new heads as copies of the first `extra` old
heads instead (key-value heads with them), and each pair of a head and its copy writes half of what
the head wrote: the new heads work at full strength from the first step. To break the pair's
symmetry their query rows move apart, the head's by +delta and the copy's by -delta (delta drawn
from a fixed seed, `noise` times the rows' std); the pair's mean output moves by the second order
of delta only. Recipe key `model.grow_heads_from: "split"`.

`new_head_scales(model, extra_heads, lr_scale)` gives the new heads their own learning rate: for
each attention projection, a per-element multiplier of its update that is `lr_scale` on the new
heads' rows and columns and 1 elsewhere (`optim.scaled_updates`). Fresh heads grafted at a
continuation's rate stay small; at a fresh model's rate they can be recruited. Recipe key
`model.grow_heads_lr`.

`grow_experts(model, extra, extra_shared)` widens the feed-forward layers instead: every routed
expert gains `extra` hidden units and the shared expert `extra_shared`. The new units start fresh
(the model's init, from a fixed seed) and write nothing yet: their columns of the down projections
are zero. They are capacity for what a token computes from what attention brought it, the part of
the model that growth had not widened yet: recipe keys `model.grow_experts`,
`model.grow_shared_expert` and, for their learning rate, `model.grow_experts_lr`.

`grow_conv(model, kernel)` widens every GDN layer's short convolution to `kernel` taps: the causal
taps reach further back (the old taps are the last ones, next to the current token) and block mode's
right taps further ahead (the old taps are the first ones); the new taps start at zero. The window
is what a GDN layer mixes from the tokens just before a position before its delta rule; with a space
token between words, four taps hold two words, and a copy of a list that has to know which line it
is in needs the line's first word within reach. Recipe keys `model.grow_conv_kernel` and, for the new
taps' learning rate, `model.grow_conv_lr` (`new_conv_scales`).
"""

import copy
from collections.abc import Sequence

import torch

# Parameters (relative to a layer) that write into the residual stream.
RESIDUAL_WRITES = ("self_attn.o_proj.weight", "linear_attn.out_proj.weight",
                   "mlp.experts.down_proj", "mlp.shared_expert.down_proj.weight")
CAUSAL_TAPS = "linear_attn.conv1d.weight"  # [C, 1, K]: tap K-1 reads the current token
CONV_TAPS = (CAUSAL_TAPS, "linear_attn.conv_right_weight")  # block mode's right taps [C, K]: tap 0 reads the next


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


HEAD_ORIGINS = ("fresh", "split")


def old_part(shape: torch.Size) -> tuple[slice, ...]:
    """Where a tensor of the init's `shape` sits in its widened tensor: first along every dim."""
    return tuple(slice(0, n) for n in shape)


def old_parts(name: str, old_shape: torch.Size,
              wide_shape: torch.Size) -> list[tuple[tuple[slice, ...], tuple[slice, ...]]]:
    """Where the init's tensor `name` sits in its widened tensor, as (source, destination) index
    pairs: first along every dim, except the fused expert projection `gate_up_proj` [E, 2I, H],
    whose gate rows and up rows each come first in their own half."""
    if name.endswith(CAUSAL_TAPS) and old_shape != wide_shape:  # the old causal taps end at the current token
        return [((), (..., slice(wide_shape[-1] - old_shape[-1], None)))]
    if name.endswith("experts.gate_up_proj") and old_shape != wide_shape:
        narrow, wide = old_shape[1] // 2, wide_shape[1] // 2
        return [((slice(None), slice(0, narrow)), (slice(None), slice(0, narrow))),
                ((slice(None), slice(narrow, None)), (slice(None), slice(wide, wide + narrow)))]
    return [((), old_part(old_shape))]


@torch.no_grad()
def widen_silently(model, wide_config, seed: int):
    """A fresh model of `wide_config` (the model's own init, from `seed`) holding each of `model`'s
    tensors in its old part (`old_parts`), whose new columns of every residual write (heads'
    `o_proj` columns, expert units' down-projection columns) are zero: it computes what `model`
    computes. On the fresh model's device and dtype."""
    with torch.random.fork_rng(devices=[]):  # the caller's random stream goes on as if not called
        torch.manual_seed(seed)
        wide = type(model)(wide_config)
    state = wide.state_dict()  # the wide model's own tensors: writing them writes the model
    for key, value in model.state_dict().items():
        if key.endswith(CONV_TAPS) and value.shape != state[key].shape:  # the new taps read nothing
            state[key].zero_()
        for source, destination in old_parts(key, value.shape, state[key].shape):
            state[key][destination] = value[source]
        if key.endswith(RESIDUAL_WRITES):  # the new parts' columns write nothing
            state[key][..., value.shape[-1]:] = 0
    return wide


@torch.no_grad()
def grow_heads(model, extra_heads: int, seed: int = 0, split: bool = False, noise: float = 0.2):
    """A new model: `model` with `extra_heads` more query heads per attention layer, residual-silent
    fresh heads or (`split`) copies of the first old heads that share their writes (`model` is left
    as it was, and returned when `extra_heads` is 0)."""
    if not extra_heads:
        return model
    if split and extra_heads > model.config.num_attention_heads:
        raise ValueError(f"grow_heads={extra_heads} split from {model.config.num_attention_heads} heads: "
                         f"each new head copies an old one, so at most {model.config.num_attention_heads}")
    if split and model.config.attention_bias:
        raise ValueError("grow_heads_from='split' copies projection weights only; this model's attention "
                         "has biases (attention_bias=True)")
    # Old heads come first along every widened dim: q_proj rows [H * (query D, gate D)], k_proj and
    # v_proj rows [H_kv * D], o_proj columns [H * D]; every other tensor keeps its shape.
    wide = widen_silently(model, widened_config(model.config, extra_heads), seed)
    if split:  # the new heads' rows and columns, fresh and silent so far, become the old heads' copies
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for layer in wide.model.layers:
                if hasattr(layer, "self_attn"):
                    split_heads(layer.self_attn, model.config.num_attention_heads, extra_heads, noise)
    return like(wide, model)


def split_heads(attn, old_heads: int, extra_heads: int, noise: float):
    """Heads `old_heads + j` (j < `extra_heads`) of a widened attention layer become copies of heads
    j, their key-value heads copies of j's, each pair writing half and its query rows moved apart."""
    dim, group = attn.head_dim, attn.num_heads // attn.num_kv_heads
    q_gate = attn.q_proj.weight.view(attn.num_heads, 2, dim, -1)  # [H, (query, gate), D, hidden]
    q_gate[old_heads:] = q_gate[:extra_heads]
    delta = torch.randn_like(q_gate[:extra_heads, 0]) * noise * q_gate[:old_heads, 0].std()
    q_gate[:extra_heads, 0] += delta
    q_gate[old_heads:, 0] -= delta
    old_kv, extra_kv = old_heads // group, extra_heads // group
    for proj in (attn.k_proj, attn.v_proj):
        rows = proj.weight.view(attn.num_kv_heads, dim, -1)  # [H_kv, D, hidden]
        rows[old_kv:] = rows[:extra_kv]
    columns = attn.o_proj.weight.view(-1, attn.num_heads, dim)  # [hidden, H, D]
    columns[:, :extra_heads] /= 2
    columns[:, old_heads:] = columns[:, :extra_heads]


def new_head_scales(model, extra_heads: int, lr_scale: float) -> dict[str, torch.Tensor]:
    """Parameter name -> per-element update multiplier for each tensor that `grow_heads` widened:
    `lr_scale` on the last `extra_heads` query heads' elements (outside the init's shape, as
    `grow_heads` lays them out) and 1 on the old heads'."""
    group = model.config.num_attention_heads // model.config.num_key_value_heads
    narrow = copy.deepcopy(model.config)  # the config `grow_heads` widened
    narrow.num_attention_heads -= extra_heads
    narrow.num_key_value_heads -= extra_heads // group
    return new_part_scales(model, narrow, lr_scale)


def new_part_scales(model, narrow, lr_scale: float) -> dict[str, torch.Tensor]:
    """Parameter name -> per-element update multiplier for each tensor that is wider in `model` than
    in the config `narrow` it was grown from: `lr_scale` outside the init's parts, 1 on them."""
    with torch.device("meta"):  # shapes only
        old_shapes = {name: param.shape for name, param in type(model)(narrow).named_parameters()}
    scales = {}
    for name, param in model.named_parameters():
        if param.shape != old_shapes[name]:
            scales[name] = torch.full_like(param, lr_scale)
            for _, destination in old_parts(name, old_shapes[name], param.shape):
                scales[name][destination] = 1
    return scales


def experts_widened_config(config, extra: int, extra_shared: int):
    """`config` with `extra` more hidden units per routed expert and `extra_shared` more in the
    shared expert."""
    if extra < 0 or extra_shared < 0:
        raise ValueError(f"grow_experts={extra}, grow_shared_expert={extra_shared}: "
                         "extra hidden units must be >= 0")
    widened = copy.deepcopy(config)
    widened.moe_intermediate_size += extra
    widened.shared_expert_intermediate_size += extra_shared
    return widened


@torch.no_grad()
def grow_experts(model, extra: int, extra_shared: int = 0, seed: int = 0):
    """A new model: `model` with `extra` residual-silent fresh hidden units in every routed expert
    and `extra_shared` in every shared expert (`model` is left as it was, and returned when both
    are 0)."""
    if not extra and not extra_shared:
        return model
    return like(widen_silently(model, experts_widened_config(model.config, extra, extra_shared), seed), model)


def new_expert_scales(model, extra: int, extra_shared: int, lr_scale: float) -> dict[str, torch.Tensor]:
    """Parameter name -> per-element update multiplier for each tensor that `grow_experts` widened:
    `lr_scale` on the new units' rows and columns, 1 on the old units'."""
    narrow = copy.deepcopy(model.config)  # the config `grow_experts` widened
    narrow.moe_intermediate_size -= extra
    narrow.shared_expert_intermediate_size -= extra_shared
    return new_part_scales(model, narrow, lr_scale)


def conv_widened_config(config, kernel: int):
    """`config` with `kernel` taps in every GDN layer's short convolution (0: unchanged)."""
    if kernel and kernel < config.linear_conv_kernel_dim:
        raise ValueError(f"grow_conv_kernel={kernel} must be 0 (unchanged) or at least the model's "
                         f"linear_conv_kernel_dim={config.linear_conv_kernel_dim}")
    widened = copy.deepcopy(config)
    widened.linear_conv_kernel_dim = kernel or config.linear_conv_kernel_dim
    return widened


@torch.no_grad()
def grow_conv(model, kernel: int):
    """A new model: `model` whose GDN short convolutions have `kernel` taps, the new ones zero, so it
    computes what `model` computes (`model` is left as it was, and returned when `kernel` is 0 or
    its own)."""
    if not kernel or kernel == model.config.linear_conv_kernel_dim:
        return model
    return like(widen_silently(model, conv_widened_config(model.config, kernel), seed=0), model)


def new_conv_scales(model, old_kernel: int, lr_scale: float) -> dict[str, torch.Tensor]:
    """Parameter name -> per-element update multiplier for each conv tap tensor that `grow_conv`
    widened from `old_kernel` taps: `lr_scale` on the new taps, 1 on the old."""
    narrow = copy.deepcopy(model.config)
    narrow.linear_conv_kernel_dim = old_kernel
    return new_part_scales(model, narrow, lr_scale)
