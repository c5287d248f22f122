"""Lazy loading of a checkpoint directory (SPEC §9) into a model whose parameters are on `meta`.

Contract: `index_checkpoint` reads only safetensors headers; `plan_sources` checks every expected
parameter against them (names, shapes) before any data is read; `load_parameters` then reads one
parameter at a time through `safetensors.safe_open` (mmap) straight to the target dtype/device and
assigns it. Each parameter is copied into freshly allocated memory (mapped views are not aligned,
which changes CPU kernel numerics); at most about CHUNK_BYTES of a file is mapped at a time, so
peak host memory is what the model holds on the host plus one chunk.
"""

import json
import os
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
from safetensors import safe_open
from torch import nn
from transformers.utils import logging

from .checkpoint_names import (BLOCK_FILES, INDEX_FILE, WEIGHTS_FILE, block_file, expert_key,
                               expert_projs, is_fused_experts, normalize_key)

logger = logging.get_logger(__name__)

SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64,
    "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}
PROGRESS_MIN_BYTES = 1 << 30  # no progress bar for checkpoints under 1 GiB
CHUNK_BYTES = 16 << 20  # larger tensors are copied in chunks of about this size


class CheckpointError(ValueError):
    """A checkpoint does not match the model: a tensor is missing or has the wrong shape."""


@dataclass(frozen=True)
class TensorRef:
    """Where one stored tensor lives: `file` (name inside the checkpoint dir) and its stored `key`."""
    file: str
    key: str
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class CheckpointIndex:
    """Header view of a checkpoint: in-memory key (prefix-normalised) -> where it is stored."""
    root: Path
    tensors: dict[str, TensorRef]
    backbone_where: str  # for messages: which file(s) hold backbone tensors
    block_files: set[str] = field(default_factory=set)  # bd_gdn_* files present

    def where(self, name: str) -> str:
        return block_file(name) or self.backbone_where


@dataclass(frozen=True)
class Part:
    """One stored tensor that fills (part of) a parameter: the whole of it (`expert` None), or
    expert `expert`'s slice of a fused parameter (`proj` says which rows)."""
    ref: TensorRef
    expert: int | None = None
    proj: str | None = None


@dataclass
class LoadPlan:
    sources: dict[str, list[Part]]  # parameter name -> stored tensors that make it
    defaults: list[str]  # block parameters whose bd_gdn_* file is absent: keep the init values
    tied: dict[str, str]  # parameter name -> the parameter it shares (not stored)
    unused: list[str]  # stored keys no parameter reads


def contained_file(root: Path, name: object, where: Path) -> str:
    """`name` (a file a checkpoint lists) if it names a file inside `root`; CheckpointError for an
    absolute path or a `..` escape. (Symlinks inside the folder are the folder's own business: the
    Hub cache links each file to a blob outside its snapshot folder.)"""
    if not isinstance(name, str) or not name or "\0" in name:
        raise CheckpointError(f"{where} names the file {name!r}, which is not a file name")
    normal = os.path.normpath(name)
    if os.path.isabs(name) or normal == ".." or normal.startswith(".." + os.sep) or normal == ".":
        raise CheckpointError(f"{where} names the file '{name}', which lies outside the checkpoint "
                              f"folder {root}; every file a checkpoint names must be inside it")
    return name


def _read_header(root: Path, file: str) -> dict[str, TensorRef]:
    out = {}
    try:
        with safe_open(root / file, framework="pt") as f:
            for key in f.keys():
                s = f.get_slice(key)
                out[key] = TensorRef(file, key, tuple(s.get_shape()), SAFETENSORS_DTYPES[s.get_dtype()])
    except (OSError, KeyError) as e:
        raise CheckpointError(f"cannot read {root / file}: {e}") from e
    except Exception as e:  # safetensors' own error: a truncated or corrupt file
        if type(e).__name__ != "SafetensorError":
            raise
        raise CheckpointError(f"{root / file} is not a readable safetensors file (truncated or corrupt?): "
                              f"{e}") from e
    return out


def _weight_map(index_path: Path) -> dict[str, str]:
    try:
        index = json.loads(index_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{index_path} is not readable JSON: {e}") from e
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index_path} has no 'weight_map' object (tensor name -> shard file)")
    for shard in weight_map.values():
        if not isinstance(shard, str):
            contained_file(index_path.parent, shard, index_path)  # raises: not a file name
    for shard in set(weight_map.values()):
        contained_file(index_path.parent, shard, index_path)
    return weight_map


def index_checkpoint(root: str | Path) -> CheckpointIndex:
    """Read the headers of a checkpoint dir. Raises FileNotFoundError naming a missing shard or the
    missing weights file, CheckpointError for a key the index lists but its shard lacks."""
    root = Path(root)
    index_path = root / INDEX_FILE
    stored: dict[str, TensorRef] = {}
    if index_path.is_file():
        weight_map = _weight_map(index_path)
        shards = sorted(set(weight_map.values()))
        for shard in shards:
            if not (root / shard).is_file():
                raise FileNotFoundError(f"shard '{shard}' listed in {index_path} is missing from {root}")
        headers = {shard: _read_header(root, shard) for shard in shards}
        for key, shard in weight_map.items():
            if key not in headers[shard]:
                raise CheckpointError(f"tensor '{key}' is listed in {index_path} under '{shard}', "
                                      f"but {root / shard} does not contain it")
            stored[key] = headers[shard][key]
        where = f"the shards listed in {INDEX_FILE}"
    elif (root / WEIGHTS_FILE).is_file():
        stored.update(_read_header(root, WEIGHTS_FILE))
        where = WEIGHTS_FILE
    else:
        raise FileNotFoundError(f"{root} holds neither {WEIGHTS_FILE} nor {INDEX_FILE}")
    present = {name for name in BLOCK_FILES if (root / name).is_file()}
    for name in sorted(present):
        stored.update(_read_header(root, name))
    tensors = {}
    for key, ref in stored.items():
        name = normalize_key(key)
        if name is not None:
            tensors[name] = ref
    return CheckpointIndex(root, tensors, where, present)


def _check_shape(ref: TensorRef, expected: tuple[int, ...], root: Path) -> None:
    scalar_as_vector = expected == () and ref.shape in ((1,), ())
    if ref.shape != tuple(expected) and not scalar_as_vector:
        raise CheckpointError(f"tensor '{ref.key}' in {root / ref.file} has shape {list(ref.shape)}, "
                              f"but the model expects {list(expected)}")


def _expert_parts(ckpt: CheckpointIndex, name: str, shape: tuple[int, ...]) -> list[Part] | None:
    """Per-expert parts of fused parameter `name` [E, rows, cols], or None when not stored per expert."""
    projs = expert_projs(name)
    if expert_key(name, 0, projs[0]) not in ckpt.tensors:
        return None
    rows = shape[1] // len(projs)  # gate_up: gate and up are [I, H] halves of [2I, H]
    parts = []
    for e in range(shape[0]):
        for proj in projs:
            key = expert_key(name, e, proj)
            if key not in ckpt.tensors:
                raise CheckpointError(f"missing tensor '{key}': expected in {ckpt.where(name)} "
                                      f"of {ckpt.root} (the other experts of '{name}' are stored per expert)")
            ref = ckpt.tensors[key]
            _check_shape(ref, (rows, shape[2]), ckpt.root)
            parts.append(Part(ref, e, proj))
    return parts


def plan_sources(ckpt: CheckpointIndex, expected: dict[str, tuple[int, ...]],
                 tied: dict[str, str] | None = None) -> LoadPlan:
    """Map every expected parameter (name -> shape) to stored tensors, checking shapes.

    `tied` maps parameters that are not loaded (tied `lm_head.weight`) to the one they share.
    A block parameter whose bd_gdn_* file is absent keeps its default; one missing from a present
    file is an error, as is any other missing tensor."""
    plan = LoadPlan({}, [], dict(tied or {}), [])
    for name, shape in expected.items():
        if name in ckpt.tensors:
            _check_shape(ckpt.tensors[name], shape, ckpt.root)
            plan.sources[name] = [Part(ckpt.tensors[name])]
        elif is_fused_experts(name) and (parts := _expert_parts(ckpt, name, shape)) is not None:
            plan.sources[name] = parts
        elif block_file(name) is not None and block_file(name) not in ckpt.block_files:
            plan.defaults.append(name)
        else:
            hint = ""
            if is_fused_experts(name):
                hint = f" (or per expert as '{expert_key(name, 0, expert_projs(name)[0])}', …)"
            raise CheckpointError(f"missing tensor '{name}'{hint}: expected in "
                                  f"{ckpt.where(name)} of {ckpt.root}")
    used = {p.ref.key for parts in plan.sources.values() for p in parts}
    plan.unused = sorted(ref.key for ref in ckpt.tensors.values() if ref.key not in used)
    return plan


def copy_stored(root: Path, ref: TensorRef, out: torch.Tensor) -> None:
    """Copy a stored tensor into `out` (same number of elements; any dtype/device).

    Pages mapped for a copy stay resident while the file is open, so a tensor larger than
    CHUNK_BYTES is copied in row chunks with the file reopened per chunk."""
    out = out.view(ref.shape)
    if out.numel() * ref.dtype.itemsize <= CHUNK_BYTES or out.dim() == 0:
        with safe_open(root / ref.file, framework="pt") as f:
            out.copy_(f.get_tensor(ref.key))
        return
    rows = max(1, CHUNK_BYTES // (out[0].numel() * ref.dtype.itemsize))
    for start in range(0, out.shape[0], rows):
        with safe_open(root / ref.file, framework="pt") as f:
            out[start:start + rows].copy_(f.get_slice(ref.key)[start:start + rows])


def read_parameter(root: Path, parts: list[Part], shape: tuple[int, ...], dtype: torch.dtype,
                   device: torch.device) -> torch.Tensor:
    """Materialise one parameter from its stored parts into fresh (aligned) memory on device."""
    out = torch.empty(shape, dtype=dtype, device=device)
    half = shape[1] // 2 if len(shape) > 1 else 0
    for part in parts:
        if part.expert is None:
            copy_stored(root, part.ref, out)
        else:  # out [E, rows, cols]; gate_up rows are cat(gate [I], up [I])
            rows = {"gate_proj": slice(0, half), "up_proj": slice(half, None)}.get(part.proj, slice(None))
            copy_stored(root, part.ref, out[part.expert, rows])
    return out


def _assign(model: nn.Module, name: str, tensor: torch.Tensor) -> None:
    module_name, _, attr = name.rpartition(".")
    module = model.get_submodule(module_name)
    old = module._parameters[attr]
    module._parameters[attr] = nn.Parameter(tensor, requires_grad=old.requires_grad)


def load_parameters(model: nn.Module, ckpt: CheckpointIndex, plan: LoadPlan, dtype: torch.dtype,
                    device: torch.device) -> None:
    """Fill `model`'s parameters per `plan`, one at a time; move defaults and buffers to device."""
    params = dict(model.named_parameters(remove_duplicate=False))
    files = {part.ref.file for parts in plan.sources.values() for part in parts}
    total = sum((ckpt.root / file).stat().st_size for file in files)
    bar = logging.tqdm(total=len(plan.sources), desc="Loading checkpoint", unit="tensor",
                       disable=total < PROGRESS_MIN_BYTES)
    for name, parts in plan.sources.items():
        # integer parameters (quantized weights) keep their stored dtype; float ones take `dtype`
        target = dtype if params[name].is_floating_point() else params[name].dtype
        _assign(model, name, read_parameter(ckpt.root, parts, tuple(params[name].shape), target, device))
        bar.update(1)
    bar.close()
    for name in plan.defaults:
        _assign(model, name, params[name].detach().to(device=device, dtype=dtype))
    for name, source in plan.tied.items():
        module_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(module_name), attr, model.get_parameter(source))
    for module in model.modules():
        for key, buf in module._buffers.items():
            if buf is not None:
                module._buffers[key] = buf.to(device)
    if plan.defaults:
        files = sorted({block_file(n) for n in plan.defaults})
        warnings.warn(f"{ckpt.root} has no {' / '.join(files)}: {len(plan.defaults)} block-mode parameters "
                      "keep their defaults (zero right conv, logit_scale sqrt(d_k), history_bias 0, "
                      "history_c 1)", stacklevel=3)
    if plan.unused:
        logger.warning(f"{len(plan.unused)} tensors in {ckpt.root} are not used by the model, e.g. "
                       f"{plan.unused[:5]}")


@contextmanager
def params_on_meta(keep_real: Callable[[str], bool] = lambda name: False) -> Iterator[None]:
    """While active, every parameter a module registers moves to the meta device (no memory), except
    those whose attribute name `keep_real` accepts. Buffers stay real, so values computed at init
    (rotary frequencies) survive. Not thread-safe: it patches `nn.Module.register_parameter`."""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and not keep_real(name):
            p = module._parameters[name]
            module._parameters[name] = type(p)(p.to("meta"), requires_grad=p.requires_grad)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def checkpoint_dtype(ckpt: CheckpointIndex, config_dtype) -> torch.dtype:
    """dtype="auto": the config's `dtype` if set, else the dtype holding most stored float bytes."""
    if isinstance(config_dtype, str) and config_dtype != "auto":
        return getattr(torch, config_dtype)
    if isinstance(config_dtype, torch.dtype):
        return config_dtype
    sizes: dict[torch.dtype, int] = {}
    for ref in ckpt.tensors.values():
        if ref.dtype.is_floating_point:
            n = 1
            for d in ref.shape:
                n *= d
            sizes[ref.dtype] = sizes.get(ref.dtype, 0) + n * ref.dtype.itemsize
    return max(sizes, key=sizes.get) if sizes else torch.float32
