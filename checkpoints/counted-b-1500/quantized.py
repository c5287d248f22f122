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

The forward of a bf16 model on CPU: torch's packed int4 / int8 matmul kernels (the kernel section below;
INT8 only up to a few rows per call); the weight is laid out for them once, after quantizing or
loading (`pack_quantized`), in place and at the same size; `state_dict` still writes the stored
format above. The plain PyTorch twin, used everywhere else (CUDA, fp32 models, where the kernels are
slower, group sizes or widths they refuse) and everywhere with `CLOVER_QUANT_KERNELS=0`: dequantize
the weight (only the experts a call hits) to the activation dtype, then the float matmul.
See BENCHMARKS.md for speed and error of both.
"""

import os
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

QUANT_METHOD = "clover_weight_only"
BITS = (8, 4)
LINEAR_TARGETS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
                  "linear_attn": ("in_proj_qkv", "in_proj_z", "out_proj"),
                  "mlp.shared_expert": ("gate_proj", "up_proj", "down_proj")}
EXPERT_TARGETS = ("gate_up_proj", "down_proj")
KERNELS_ENV = "CLOVER_QUANT_KERNELS"  # "0": never pack, so every forward takes the plain twin


def kernels_enabled() -> bool:
    return os.environ.get(KERNELS_ENV, "1") != "0"


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


# ---- torch's packed CPU kernels (the fast path; `dequantize_weight` + a float matmul is its twin) ----
# INT4: `aten._convert_weight_to_int4pack_for_cpu` / `aten._weight_int4pack_mm_for_cpu` compute
# x · ((q − 8)·s + z)ᵀ, our format exactly (scales and zeros as one [K/g, N, 2] tensor). They accept
# group sizes 32, 64, 128, 256, N divisible by 16, and fp32 / bf16 / fp16 activations (scales in the
# activation dtype). The packed weight holds the same N·K nibbles as the stored one, reordered for the
# kernel's tiles; the order is not a documented contract (it differs between AVX-512 and AVX2 builds),
# so `unpack_int4` reads it back by packing the bit planes of the nibble positions (`_int4_order`).
#
# INT8: `aten._weight_int8pack_mm` scales whole output channels only; a group-wise weight runs as one
# call per group of g input columns (the weight laid out [K/g, N, g], each group contiguous) with the
# partial outputs summed in fp32. It beats dequantize + matmul only at a few rows (`INT8_KERNEL_MAX_ROWS`).
#
# When they pay (one thread, this project's AVX-512-BF16 CPU, BENCHMARKS.md): bf16 activations only.
# In fp32 both kernels are 15-30x slower than in bf16 (a 1024 x 2048 int4 weight, one row: 3.75 against
# 0.125 ms), slower than the plain path, so fp32 and fp16 models are not packed (`FAST_DTYPES`). In bf16
# the int4 kernel beats dequantize + matmul up to ~64 rows per call and loses 1.65x at 256 (prefill:
# 12.3 against 7.4 ms for [1024, 2048]); unpacking for the plain path costs more (9.4 ms), so INT4
# always takes the kernel.
#
# torchao is not used: on CPU its weight-only int4 (`Int4CPULayout`) calls the same int4pack kernels and
# its int8 weight-only path dequantizes, so it would add a dependency and its own checkpoint format
# without a faster kernel.

INT4_GROUP_SIZES = (32, 64, 128, 256)
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what the kernels accept
FAST_DTYPES = (torch.bfloat16,)  # where they beat the plain path (measured; fp16 not measured)
INT8_KERNEL_MAX_ROWS = 4  # above: dequantize + matmul (1024 x 2048, bf16: 0.58 vs 0.98 ms at 4 rows, 1.6 vs 1.3 at 16)


def int4_kernel_applies(shape: tuple[int, ...], group_size: int) -> bool:
    """Whether torch's CPU int4pack kernel takes a weight of `shape` [..., N, K] at `group_size`."""
    return (hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and group_size in INT4_GROUP_SIZES
            and shape[-2] % 16 == 0)


def int8_kernel_applies(shape: tuple[int, ...], group_size: int) -> bool:
    return hasattr(torch.ops.aten, "_weight_int8pack_mm")


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., N, K/2] -> the nibbles [..., N, K] (low nibble first)."""
    return torch.stack((packed & 15, packed >> 4), dim=-1).flatten(-2)


def _bytes(nibbles: torch.Tensor) -> torch.Tensor:
    """The inverse of `_nibbles`."""
    return nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)


def _pack_one(nibbles: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(nibbles.to(torch.int32), 1)


@lru_cache(maxsize=8)  # the real model has 6 quantized shapes (144 MB of orders in all)
def _int4_order(n: int, k: int) -> torch.Tensor:
    """int32 [N·K]: for each nibble of the kernel's packed layout, the flat [N, K] position it came
    from. Packing bit b of every position's index tells bit b of each packed nibble's source. Costs
    0.3 s for [1024, 2048] and 5 s for [8192, 2048], once per shape: only `state_dict` of a packed
    model and the fallback to the plain path unpack."""
    positions = torch.arange(n * k, dtype=torch.int32)
    source = torch.zeros(n * k, dtype=torch.int32)
    for bit in range(max(1, (n * k - 1).bit_length())):
        plane = ((positions >> bit) & 1).view(n, k)
        source |= _nibbles(_pack_one(plane)).flatten().to(torch.int32) << bit
    if not torch.equal(source.sort().values, positions):
        raise RuntimeError(f"torch {torch.__version__}'s int4pack layout for [{n}, {k}] is not a "
                           "reordering of the nibbles; the INT4 kernel path cannot be used")
    return source


def pack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """Stored uint8 [..., N, K/2] -> the kernel's packed layout, same shape and dtype."""
    flat = qweight.reshape(-1, *qweight.shape[-2:])  # [E, N, K/2]
    return torch.stack([_pack_one(_nibbles(w)) for w in flat]).view(qweight.shape)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack_int4`."""
    n, k = packed.shape[-2], 2 * packed.shape[-1]
    source = _int4_order(n, k).to(packed.device).long()
    out = []
    for w in packed.reshape(-1, n, k // 2):
        stored = torch.empty(n * k, dtype=torch.uint8, device=packed.device)
        stored[source] = _nibbles(w).flatten()
        out.append(_bytes(stored.view(n, k)))
    return torch.stack(out).view(packed.shape)


def int4_scales_and_zeros(scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """[..., N, K/g] twice -> [..., K/g, N, 2], the kernel's layout."""
    return torch.stack((scales, zeros), dim=-1).transpose(-3, -2).contiguous()


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, group_size: int,
                scales_and_zeros: torch.Tensor) -> torch.Tensor:
    """x [M, K] · wᵀ -> [M, N] in x's dtype."""
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x.contiguous(), packed, group_size,
                                                      scales_and_zeros.to(x.dtype))


def pack_int8(qweight: torch.Tensor, group_size: int) -> torch.Tensor:
    """Stored int8 [..., N, K] -> [..., K/g, N, g] (each group's columns contiguous), viewed back as
    [..., N, K] so the parameter keeps its shape."""
    groups = qweight.unflatten(-1, (qweight.shape[-1] // group_size, group_size))  # [..., N, K/g, g]
    return groups.transpose(-3, -2).contiguous().view(qweight.shape)


def unpack_int8(packed: torch.Tensor, group_size: int) -> torch.Tensor:
    n, k = packed.shape[-2:]
    groups = packed.reshape(*packed.shape[:-2], k // group_size, n, group_size)  # [..., K/g, N, g]
    return groups.transpose(-3, -2).reshape(packed.shape).contiguous()


def int8_group_scales(scales: torch.Tensor) -> torch.Tensor:
    """[..., N, K/g] -> [..., K/g, N], each group's channel scales contiguous."""
    return scales.transpose(-2, -1).contiguous()


def int8_matmul(x: torch.Tensor, packed: torch.Tensor, group_size: int, group_scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] · wᵀ -> [M, N] in x's dtype: one per-channel int8 kernel call per input group."""
    n, k = packed.shape
    groups = packed.view(k // group_size, n, group_size)  # [K/g, N, g]
    scales = group_scales.to(x.dtype)
    y = torch.zeros(x.shape[0], n, dtype=torch.float32, device=x.device)
    for g in range(k // group_size):
        columns = x[:, g * group_size:(g + 1) * group_size].contiguous()  # [M, g]
        y += torch.ops.aten._weight_int8pack_mm(columns, groups[g], scales[g])
    return y.to(x.dtype)


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
        # packed: qweight holds the kernel's layout (same shape) and kernel_scales its scales (and zeros)
        self.packed = False
        self.register_buffer("kernel_scales", None, persistent=False)
        self._register_state_dict_hook(_write_stored_layout)

    @classmethod
    def from_float(cls, w: torch.Tensor, bits: int, group_size: int) -> "QuantizedWeight":
        module = cls(tuple(w.shape), bits, group_size, w.dtype, w.device)
        module._fill(w)
        return module

    @torch.no_grad()
    def _fill(self, w: torch.Tensor, chunk_rows: int = 16384) -> None:
        """Quantize the float weight `w` into this module's parameters, `chunk_rows` rows of K at a
        time, so that the fp32 temporaries stay small (a 256-expert stack is 2 GB in fp32)."""
        rows = w.detach().reshape(-1, w.shape[-1])  # [R, K]
        flat = {name: t.data.view(rows.shape[0], -1) for name, t in
                (("qweight", self.qweight), ("scales", self.scales), ("zeros", self.zeros)) if t is not None}
        for start in range(0, rows.shape[0], chunk_rows):
            for name, tensor in quantize_weight(rows[start:start + chunk_rows], self.bits, self.group_size).items():
                flat[name][start:start + chunk_rows] = tensor

    def stored_qweight(self) -> torch.Tensor:
        """qweight in the stored layout (a copy when packed)."""
        if not self.packed:
            return self.qweight.data
        return unpack_int4(self.qweight.data) if self.bits == 4 else unpack_int8(self.qweight.data, self.group_size)

    def dequantize(self, dtype: torch.dtype, index: int | None = None) -> torch.Tensor:
        """The float weight (expert `index` of a stacked weight) in `dtype`."""
        pick = (lambda t: t) if index is None else (lambda t: t[index])
        zeros = None if self.zeros is None else pick(self.zeros)
        if not self.packed:
            qweight = pick(self.qweight)
        elif self.bits == 8:  # unpack only the expert picked: a transpose of its bytes
            qweight = unpack_int8(pick(self.qweight.data), self.group_size)
        else:
            qweight = pick(self.stored_qweight())
        return dequantize_weight(qweight, pick(self.scales), zeros, self.group_size, dtype)

    def kernel_applies(self, dtypes: tuple[torch.dtype, ...] = FAST_DTYPES) -> bool:
        """Whether torch's CPU kernel takes this weight (bits, group size, widths, device) and pays
        for a model in its dtype (`dtypes`: the float dtypes to accept; bf16 by default)."""
        applies = int4_kernel_applies if self.bits == 4 else int8_kernel_applies
        return (self.qweight.device.type == "cpu" and self.scales.dtype in dtypes
                and applies(self.shape, self.group_size))

    @torch.no_grad()
    def pack(self, dtypes: tuple[torch.dtype, ...] = FAST_DTYPES) -> bool:
        """Lay the weight out for torch's CPU kernel, in place, where `kernel_applies(dtypes)`; return
        whether it is packed. (Tests pass `KERNEL_DTYPES` to run the kernels in fp32 too.)"""
        if self.packed or not self.kernel_applies(dtypes):
            return self.packed
        if self.bits == 4:
            self.qweight.data = pack_int4(self.qweight.data)
            self.kernel_scales = int4_scales_and_zeros(self.scales, self.zeros)
        else:
            self.qweight.data = pack_int8(self.qweight.data, self.group_size)
            self.kernel_scales = int8_group_scales(self.scales)
        self.packed = True
        return True

    @torch.no_grad()
    def unpack(self) -> None:
        """Back to the stored layout (the plain path's)."""
        if self.packed:
            self.qweight.data = self.stored_qweight()
            self.kernel_scales, self.packed = None, False

    def _kernel_takes(self, x: torch.Tensor) -> bool:
        return (x.device.type == "cpu" and self.qweight.device.type == "cpu" and x.dtype in KERNEL_DTYPES
                and not (torch.is_grad_enabled() and x.requires_grad))  # the kernels have no backward

    def matmul(self, x: torch.Tensor, index: int | None = None) -> torch.Tensor:
        """x [..., K] · wᵀ -> [..., N] (w: expert `index` of a stacked weight). A packed weight runs
        torch's kernel (INT8: up to `INT8_KERNEL_MAX_ROWS` rows); an input it does not take (CUDA,
        float64, autograd) unpacks the weight for good. Otherwise the plain path: dequantize, then
        the float matmul."""
        if self.packed and not self._kernel_takes(x):
            self.unpack()
        rows = x.numel() // x.shape[-1]
        if not self.packed or (self.bits == 8 and rows > INT8_KERNEL_MAX_ROWS):
            return F.linear(x, self.dequantize(x.dtype, index))
        pick = (lambda t: t) if index is None else (lambda t: t[index])
        kernel = int4_matmul if self.bits == 4 else int8_matmul
        y = kernel(x.reshape(-1, x.shape[-1]), pick(self.qweight), self.group_size, pick(self.kernel_scales))
        return y.view(*x.shape[:-1], y.shape[-1])  # [..., N]

    def _load_from_state_dict(self, *args, **kwargs):
        """A state dict holds the stored layout: load into that, then pack again."""
        packed = self.packed
        self.unpack()
        super()._load_from_state_dict(*args, **kwargs)
        if packed:  # as it was, whatever its dtype
            self.pack(KERNEL_DTYPES)

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
        module._fill(w)
        if linear.bias is not None:
            module.bias.data = linear.bias.detach()
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.matmul(x)
        return y if self.bias is None else y + self.bias.to(y.dtype)


def _write_stored_layout(module: QuantizedWeight, state_dict: dict, prefix: str, local_metadata) -> None:
    if module.packed:
        state_dict[prefix + "qweight"] = module.stored_qweight()


def pack_quantized(model: nn.Module, dtypes: tuple[torch.dtype, ...] = FAST_DTYPES) -> int:
    """Lay every quantized weight of `model` out for torch's CPU kernels (`QuantizedWeight.pack`);
    a no-op off the CPU, on `meta`, for a model whose dtype is not in `dtypes` (bf16 by default), or
    with CLOVER_QUANT_KERNELS=0. Return how many were packed."""
    if not kernels_enabled():
        return 0
    return sum(m.pack(dtypes) for m in model.modules() if isinstance(m, QuantizedWeight) and not m.qweight.is_meta)


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


def quantize_modules(model: nn.Module, bits: int, group_size: int, pack: bool = True) -> nn.Module:
    """Replace every target weight of `model` (in place) by its quantized form, laid out for torch's CPU
    kernels unless `pack=False` (a model about to be saved); return `model`. Weights on `meta` become
    empty quantized modules on `meta` (for loading a quantized checkpoint)."""
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
    if pack:
        pack_quantized(model)
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
