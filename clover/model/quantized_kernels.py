"""torch's own packed CPU matmul kernels for the weight-only format of `quantized.py` (the fast path;
`quantized.dequantize_weight` + a float matmul is its plain twin).

INT4: `aten._convert_weight_to_int4pack_for_cpu` / `aten._weight_int4pack_mm_for_cpu` compute
x · ((q − 8)·s + z)ᵀ, our format exactly (scales and zeros as one [K/g, N, 2] tensor). They accept
group sizes 32, 64, 128, 256, N divisible by 16, and fp32 / bf16 / fp16 activations (scales in the
activation dtype). The packed weight holds the same N·K nibbles as the stored one, reordered for the
kernel's tiles; the order is not a documented contract (it differs between AVX-512 and AVX2 builds),
so `unpack_int4` reads it back by packing the bit planes of the nibble positions (`_int4_order`).

INT8: `aten._weight_int8pack_mm` scales whole output channels only; a group-wise weight runs as one
call per group of g input columns (the weight laid out [K/g, N, g], each group contiguous) with the
partial outputs summed in fp32. It beats dequantize + matmul only at a few rows (`INT8_KERNEL_MAX_ROWS`).

When they pay (one thread, this project's AVX-512-BF16 CPU, BENCHMARKS.md): bf16 activations only.
In fp32 both kernels are 15-30x slower than in bf16 (a 1024 x 2048 int4 weight, one row: 3.75 against
0.125 ms), slower than the plain path, so fp32 and fp16 models are not packed (`FAST_DTYPES`). In bf16
the int4 kernel beats dequantize + matmul up to ~64 rows per call and loses 1.65x at 256 (prefill:
12.3 against 7.4 ms for [1024, 2048]); unpacking for the plain path costs more (9.4 ms), so INT4
always takes the kernel.

torchao is not used: on CPU its weight-only int4 (`Int4CPULayout`) calls the same int4pack kernels and
its int8 weight-only path dequantizes, so it would add a dependency and its own checkpoint format
without a faster kernel.
"""

from functools import lru_cache

import torch

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
