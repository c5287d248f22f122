"""Weight-only INT8 / INT4 group-wise quantization: the stored format, its modules, and which weights
it covers. Lives in the model bundle so a quantized checkpoint loads with `trust_remote_code=True`.

Format (per output row, one group of `group_size` input columns shares its parameters):
  int8: `qweight` int8 [..., N, K], `scales` [..., N, K/g];  w ≈ q · s,  q in [-127, 127] (symmetric).
  int4: `qweight` uint8 [..., N, K/2] (low nibble = even column), `scales`, `zeros` [..., N, K/g];
        w ≈ (q − 8) · s + z,  q in [0, 15] (min-max; torch's int4pack convention).
Scales and zeros are stored in the model's float dtype. `config.json` carries
`quantization_config = {"quant_method": "clover_weight_only", "bits", "group_size"}`.

Quantized: routed experts, the shared expert, attention q/k/v/o and GDN in_proj_qkv / in_proj_z /
out_proj. Left in float: embeddings, lm_head, norms, the router and shared-expert gate (routing
decisions), GDN in_proj_a / in_proj_b (32-row decay and beta gates), the conv and bd_gdn scalars.

The forward is the plain PyTorch path everywhere: dequantize the weight (only the experts a call
hits) to the activation dtype, then the float matmul. Memory at rest is what shrinks; see
BENCHMARKS.md for what it costs in speed.
"""

import torch
import torch.nn.functional as F
from torch import nn

QUANT_METHOD = "clover_weight_only"
BITS = (8, 4)
LINEAR_TARGETS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
                  "linear_attn": ("in_proj_qkv", "in_proj_z", "out_proj"),
                  "mlp.shared_expert": ("gate_proj", "up_proj", "down_proj")}
EXPERT_TARGETS = ("gate_up_proj", "down_proj")


def check_spec(bits: int, group_size: int, in_features: int | None = None, name: str = "") -> None:
    if bits not in BITS:
        raise ValueError(f"bits={bits} must be one of {BITS}")
    if group_size < 2 or group_size % 2:
        raise ValueError(f"group_size={group_size} must be an even number >= 2")
    if in_features is not None and in_features % group_size:
        raise ValueError(f"group_size={group_size} does not divide the {in_features} input columns of "
                         f"{name}; choose a group size that divides every quantized width")


def quantize_weight(w: torch.Tensor, bits: int, group_size: int) -> dict[str, torch.Tensor]:
    """w [..., N, K] float -> {"qweight", "scales"[, "zeros"]} in the format above (scales in w's dtype)."""
    check_spec(bits, group_size, w.shape[-1], "this weight")
    groups = w.float().unflatten(-1, (w.shape[-1] // group_size, group_size))  # [..., N, K/g, g]
    if bits == 8:
        scales = groups.abs().amax(-1).clamp(min=1e-12) / 127  # [..., N, K/g]
        q = (groups / scales[..., None]).round().clamp(-127, 127).to(torch.int8)
        return {"qweight": q.flatten(-2), "scales": scales.to(w.dtype)}
    low, high = groups.amin(-1), groups.amax(-1)
    scales = ((high - low) / 15).clamp(min=1e-12)
    q = ((groups - low[..., None]) / scales[..., None]).round().clamp(0, 15).to(torch.uint8).flatten(-2)
    packed = q[..., 0::2] | (q[..., 1::2] << 4)  # [..., N, K/2]
    return {"qweight": packed, "scales": scales.to(w.dtype), "zeros": (low + 8 * scales).to(w.dtype)}


def dequantize_weight(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                      group_size: int, dtype: torch.dtype) -> torch.Tensor:
    """The stored format -> w [..., N, K] in `dtype` (int4 when `zeros` is given)."""
    if zeros is None:
        q = qweight.to(dtype)
    else:
        q = torch.stack((qweight & 15, qweight >> 4), dim=-1).flatten(-2).to(dtype) - 8  # [..., N, K]
    groups = q.unflatten(-1, (q.shape[-1] // group_size, group_size))  # [..., N, K/g, g]
    w = groups * scales.to(dtype)[..., None]
    if zeros is not None:
        w = w + zeros.to(dtype)[..., None]
    return w.flatten(-2)


class QuantizedWeight(nn.Module):
    """A quantized weight of shape [..., N, K] (the leading dims index experts)."""

    def __init__(self, shape: tuple[int, ...], bits: int, group_size: int, dtype: torch.dtype,
                 device: torch.device | str | None = None):
        super().__init__()
        check_spec(bits, group_size, shape[-1])
        self.bits, self.group_size, self.shape = bits, group_size, tuple(shape)
        packed = (*shape[:-1], shape[-1] // 2) if bits == 4 else tuple(shape)
        group_shape = (*shape[:-1], shape[-1] // group_size)
        frozen = dict(requires_grad=False)
        self.qweight = nn.Parameter(torch.empty(packed, dtype=torch.uint8 if bits == 4 else torch.int8,
                                                device=device), **frozen)
        self.scales = nn.Parameter(torch.empty(group_shape, dtype=dtype, device=device), **frozen)
        self.zeros = (nn.Parameter(torch.empty(group_shape, dtype=dtype, device=device), **frozen)
                      if bits == 4 else None)

    @classmethod
    def from_float(cls, w: torch.Tensor, bits: int, group_size: int) -> "QuantizedWeight":
        module = cls(tuple(w.shape), bits, group_size, w.dtype, w.device)
        for name, tensor in quantize_weight(w.detach(), bits, group_size).items():
            getattr(module, name).data = tensor
        return module

    def dequantize(self, dtype: torch.dtype, index: int | None = None) -> torch.Tensor:
        """The float weight (expert `index` of a stacked weight) in `dtype`."""
        pick = (lambda t: t) if index is None else (lambda t: t[index])
        zeros = None if self.zeros is None else pick(self.zeros)
        return dequantize_weight(pick(self.qweight), pick(self.scales), zeros, self.group_size, dtype)

    def extra_repr(self) -> str:
        return f"shape={list(self.shape)}, bits={self.bits}, group_size={self.group_size}"


class QuantizedLinear(QuantizedWeight):
    """`nn.Linear` (optional float bias) over a quantized weight."""

    def __init__(self, in_features: int, out_features: int, bits: int, group_size: int, dtype: torch.dtype,
                 bias: bool = False, device=None):
        super().__init__((out_features, in_features), bits, group_size, dtype, device)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device)) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int, group_size: int) -> "QuantizedLinear":
        w = linear.weight
        module = cls(w.shape[1], w.shape[0], bits, group_size, w.dtype, linear.bias is not None, w.device)
        for name, tensor in quantize_weight(w.detach(), bits, group_size).items():
            getattr(module, name).data = tensor
        if linear.bias is not None:
            module.bias.data = linear.bias.detach()
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantize(x.dtype), self.bias)


def quantization_targets(model: nn.Module):
    """Yield (parent module, attribute, kind) for every weight the format quantizes: kind "linear"
    (an nn.Linear attribute) or "experts" (a stacked [E, N, K] parameter of the routed experts)."""
    for layer in model.model.layers:
        for path, attrs in LINEAR_TARGETS.items():
            parent = layer
            for part in path.split("."):
                parent = getattr(parent, part, None)
            for attr in attrs if parent is not None else ():
                yield parent, attr, "linear"
        for attr in EXPERT_TARGETS:
            yield layer.mlp.experts, attr, "experts"


def _shape_of(parent: nn.Module, attr: str, kind: str) -> tuple[int, ...]:
    current = getattr(parent, attr)
    if isinstance(current, QuantizedWeight):
        return current.shape
    return tuple(current.weight.shape if kind == "linear" else current.shape)


def check_quantizable(model: nn.Module, bits: int, group_size: int) -> None:
    """Raise ValueError naming the first weight whose width `group_size` does not divide."""
    check_spec(bits, group_size)
    names = {id(m): n for n, m in model.named_modules()}
    for parent, attr, kind in quantization_targets(model):
        check_spec(bits, group_size, _shape_of(parent, attr, kind)[-1], f"{names[id(parent)]}.{attr}")


def quantize_modules(model: nn.Module, bits: int, group_size: int) -> nn.Module:
    """Replace every target weight of `model` (in place) by its quantized form; return `model`.
    Weights on `meta` become empty quantized modules on `meta` (for loading a quantized checkpoint)."""
    check_quantizable(model, bits, group_size)
    for parent, attr, kind in quantization_targets(model):
        current = getattr(parent, attr)
        if isinstance(current, QuantizedWeight):
            raise ValueError(f"the model is already quantized ({current.bits}-bit)")
        weight = current.weight if kind == "linear" else current
        if weight.is_meta:
            shape, dtype = tuple(weight.shape), weight.dtype
            module = (QuantizedLinear(shape[1], shape[0], bits, group_size, dtype,
                                      getattr(current, "bias", None) is not None, "meta")
                      if kind == "linear" else QuantizedWeight(shape, bits, group_size, dtype, "meta"))
        elif kind == "linear":
            module = QuantizedLinear.from_linear(current, bits, group_size)
        else:
            module = QuantizedWeight.from_float(current, bits, group_size)
        if kind == "experts":
            del parent._parameters[attr]
        setattr(parent, attr, module)
    model.config.quantization_config = {"quant_method": QUANT_METHOD, "bits": bits, "group_size": group_size}
    return model


def quantization_spec(config) -> tuple[int, int] | None:
    """(bits, group_size) from a config's `quantization_config`, or None for a float checkpoint."""
    spec = getattr(config, "quantization_config", None)
    if not spec:
        return None
    if spec.get("quant_method") != QUANT_METHOD:
        raise ValueError(f"quantization_config.quant_method={spec.get('quant_method')!r} is not "
                         f"{QUANT_METHOD!r}, the only format this model code reads")
    return int(spec["bits"]), int(spec["group_size"])
