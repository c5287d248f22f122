"""Convert a transformers Qwen3.5-MoE checkpoint into a Clover checkpoint (SPEC §8, §9).

The backbone tensors are copied under their text-model names (a `model.language_model.` prefix is
dropped; `mtp.*` and vision weights are left out), in the source's expert layout (per expert or
fused), cast to the output dtype. Added: zero right-conv weights and the default softmax scalars
(bd_gdn_* files), the Clover config fields, `generation_config.json` with the SPEC §2 defaults, the
model code (for `trust_remote_code=True`), and the tokenizer files with `<|mask|>` at the mask id.

Memory: every source tensor is shape-checked from the headers before any data is read, and the output
is written one shard at a time (at most `max_shard_size` of tensors in memory). The output dir
appears only when complete (written to a temporary sibling, then renamed).

Nothing is lost: `check_destination` refuses, before anything is read or written, a DST that is
SRC, lies inside it or contains it, is a file, or is a non-empty folder (with `overwrite`, a
non-empty DST must be a Clover checkpoint, which is then replaced as a whole). Temporaries of a
killed earlier run are removed (`remove_stale_siblings`); `clover convert` turns SIGTERM into an
exception so its own temporary is removed too.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from transformers.utils import logging

from clover.dtypes import DTYPE_NAMES, torch_dtype
from clover.model import CloverMoeConfig, CloverMoeForCausalLM
from clover.model.checkpoint_load import (CheckpointIndex, TensorRef, checkpoint_dtype, index_checkpoint,
                                          params_on_meta, plan_sources, read_parameter)
from clover.model.checkpoint_io import tied_parameters
from clover.model.checkpoint_names import VOCAB_ROW_KEYS, block_file, is_block_attr, normalize_key
from clover.model.checkpoint_save import (PendingTensor, atomic_directory, copy_model_code, write_block_files,
                                          write_config, write_generation_config, write_weights)

from .generation_defaults import generation_settings
from .source import read_source_config
from .tokenizer_files import copy_tokenizer, next_free_id

logger = logging.get_logger(__name__)


@dataclass(frozen=True)
class ConvertOptions:
    mask_token_id: int | None = None  # None: see `choose_mask_id`
    block_size: int = 32
    dtype: str | torch.dtype | None = None  # None / "auto": the source's dtype
    coreset: bool = True
    coreset_top_p: float = 0.9
    max_shard_size: int | str = "5GB"


@dataclass(frozen=True)
class ConvertResult:
    path: Path
    config: CloverMoeConfig
    mask_row: str  # "reused" (given id, row kept), "unused_row" (row re-initialised) or "appended"
    dtype: torch.dtype
    tokenizer_files: list[str]


def choose_mask_id(requested: int | None, vocab_size: int, tokenizer_free: int | None) -> tuple[int, str]:
    """(mask id, how its embedding row is made). A requested id is reused as is; otherwise the
    tokenizer's next free id when the embedding already has that (padding) row; otherwise a new row."""
    if requested is not None:
        if not 0 <= requested < vocab_size:
            raise ValueError(f"mask_token_id={requested} is outside the source vocabulary [0, {vocab_size}); "
                             "omit it to append a new token")
        return requested, "reused"
    if tokenizer_free is not None and tokenizer_free < vocab_size:
        return tokenizer_free, "unused_row"
    return vocab_size, "appended"


def _with_mask_row(weight: torch.Tensor, mask_id: int, mask_row: str) -> torch.Tensor:
    """weight [V, H] -> the mask row set to the mean of the rows before it (appended: [V+1, H])."""
    if mask_row == "reused":
        return weight
    mean = weight[:mask_id].mean(0, dtype=torch.float32).to(weight.dtype)  # [H]
    if mask_row == "appended":
        return torch.cat((weight, mean[None]), dim=0)
    weight = weight.clone()
    weight[mask_id] = mean
    return weight


def _read(root: Path, ref: TensorRef, dtype: torch.dtype) -> torch.Tensor:
    with safe_open(root / ref.file, framework="pt") as f:
        return f.get_tensor(ref.key).to(dtype)


def _backbone_tensors(ckpt: CheckpointIndex, sources: dict, expected: dict, dtype: torch.dtype,
                      mask_id: int, mask_row: str) -> dict[str, PendingTensor]:
    """Output key -> lazily read tensor, in model parameter order; experts keep the source layout."""
    pending = {}
    for name, parts in sources.items():
        if block_file(name):
            continue
        for part in parts:
            key = normalize_key(part.ref.key)
            numel = torch.Size(part.ref.shape).numel()
            if name in VOCAB_ROW_KEYS:
                rows = expected[name][0] + (mask_row == "appended")
                numel = rows * expected[name][1]
                read = lambda ref=part.ref: _with_mask_row(_read(ckpt.root, ref, dtype), mask_id, mask_row)
            else:
                read = lambda ref=part.ref: _read(ckpt.root, ref, dtype)
            pending[key] = PendingTensor(numel * dtype.itemsize, read)
    return pending


def _with_progress(pending: dict[str, PendingTensor], desc: str, enabled: bool):
    """(`pending` whose reads advance a byte progress bar on stderr, the bar: a context manager)."""
    bar = logging.tqdm(total=sum(p.nbytes for p in pending.values()), desc=desc, unit="B", unit_scale=True,
                       unit_divisor=1024, disable=not enabled)

    def read(p: PendingTensor) -> torch.Tensor:
        tensor = p.read()
        bar.update(p.nbytes)
        return tensor

    return {k: PendingTensor(p.nbytes, lambda p=p: read(p)) for k, p in pending.items()}, bar


def _output_dtype(requested, ckpt: CheckpointIndex, declared: str | None) -> torch.dtype:
    if requested in (None, "auto"):
        return checkpoint_dtype(ckpt, declared)
    if isinstance(requested, torch.dtype):
        return requested
    if requested not in DTYPE_NAMES:
        raise ValueError(f"dtype={requested!r} must be one of auto, {', '.join(DTYPE_NAMES)}")
    return torch_dtype(requested)


def is_clover_checkpoint(path: Path) -> bool:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") == CloverMoeConfig.model_type


def check_destination(src: Path, dst: Path, overwrite: bool = False) -> None:
    """Refuse (ValueError) a destination whose replacement would lose data; see the module doc."""
    s, d = src.resolve(), dst.resolve()
    if d == s:
        raise ValueError(f"DST {dst} is the source checkpoint; write the conversion to another folder")
    if s in d.parents:
        raise ValueError(f"DST {dst} lies inside the source checkpoint {src}; choose a folder outside it")
    if d in s.parents:
        raise ValueError(f"DST {dst} contains the source checkpoint {src}; replacing it would delete the source")
    if d.exists() and not d.is_dir():
        raise ValueError(f"DST {dst} exists and is a file, not a folder")
    if not d.is_dir() or not any(d.iterdir()):
        return
    if not overwrite:
        raise ValueError(f"DST {dst} is not empty; pass --overwrite to replace it (only a Clover checkpoint "
                         "is replaced) or choose an empty or new folder")
    if not is_clover_checkpoint(d):
        raise ValueError(f"DST {dst} is not empty and is not a Clover checkpoint (no config.json with "
                         f"model_type {CloverMoeConfig.model_type!r}); --overwrite replaces only a Clover "
                         "checkpoint")


def convert_checkpoint(src: str | Path, dst: str | Path, options: ConvertOptions = ConvertOptions(),
                       overwrite: bool = False, progress: bool = False) -> ConvertResult:
    """Write the Clover checkpoint of `src` to `dst`. `dst` must be new or empty, or with `overwrite`
    a Clover checkpoint, which is replaced (`check_destination`). Raises FileNotFoundError or
    ValueError (CheckpointError for a missing or misshapen tensor) before writing anything.
    `progress`: a progress bar on stderr over the backbone bytes written."""
    src = Path(src)
    source = read_source_config(src)
    check_destination(src, Path(dst), overwrite)
    ckpt = index_checkpoint(src)
    dtype = _output_dtype(options.dtype, ckpt, source.dtype)
    vocab = source.backbone["vocab_size"]
    requested = source.mask_token_id if options.mask_token_id is None else options.mask_token_id
    mask_id, mask_row = choose_mask_id(requested, vocab, next_free_id(src))
    clover_fields = dict(vocab_size=vocab + (mask_row == "appended"), mask_token_id=mask_id,
                         block_size=options.block_size, moe_block_coreset_enabled=options.coreset,
                         moe_block_coreset_top_p=options.coreset_top_p)
    config = CloverMoeConfig(**{**source.backbone, **source.token_ids, **clover_fields})
    with params_on_meta(keep_real=is_block_attr):  # shapes and block defaults, no weights
        model = CloverMoeForCausalLM(config)
    tied = tied_parameters(model)
    expected = {n: tuple(p.shape) for n, p in model.named_parameters() if n not in tied}
    for name in VOCAB_ROW_KEYS:
        if name in expected and mask_row == "appended":
            expected[name] = (vocab, *expected[name][1:])
    plan = plan_sources(ckpt, expected, tied)
    if plan.unused:
        logger.warning(f"convert leaves out {len(plan.unused)} tensors of {src}, e.g. {plan.unused[:5]}")
    block = {name: read_parameter(src, parts, expected[name], dtype, torch.device("cpu"))
             for name, parts in plan.sources.items() if block_file(name)}
    block.update({name: model.get_parameter(name).detach().to(dtype) for name in plan.defaults})
    with atomic_directory(dst) as tmp:
        tokenizer_files = copy_tokenizer(src, tmp, mask_id)  # first: it may refuse the mask id
        write_config(tmp, config, CloverMoeForCausalLM.__name__, dtype)
        write_generation_config(tmp, generation_settings(config, source.token_ids, src))
        pending, bar = _with_progress(_backbone_tensors(ckpt, plan.sources, expected, dtype, mask_id, mask_row),
                                      f"Converting {src.name}", progress)
        with bar:
            write_weights(tmp, pending, options.max_shard_size)
        write_block_files(tmp, block)
        copy_model_code(tmp)
    return ConvertResult(Path(dst), config, mask_row, dtype, tokenizer_files)
