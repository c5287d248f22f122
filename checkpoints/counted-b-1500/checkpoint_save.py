"""Writing a checkpoint directory (SPEC §9): sharded safetensors, the bd_gdn_* files, config with
`auto_map`, and the model code, all into a temporary sibling that replaces the target at the end.

Contract: a failure anywhere before the final rename leaves the target as it was (absent or the old
checkpoint) and no temporary directory behind. Tensors are materialised one shard at a time.
"""

import copy
import json
import os
import re
import shutil
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
from safetensors.torch import save_file

from .checkpoint_names import (AUTO_MAP, CONFIG_FILE, CONV_RIGHT_FILE, GENERATION_CONFIG_FILE,
                               INDEX_FILE, SCALARS_FILE, WEIGHTS_FILE, block_file, shard_name)
from .generation_config import without_neutral_settings

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
# files of an old checkpoint that a new save replaces rather than keeps (weights and model code)
_REPLACED = re.compile(r".*\.(safetensors|safetensors\.index\.json|bin|bin\.index\.json|pt|pth|py)$")


@dataclass(frozen=True)
class PendingTensor:
    """A tensor to write: its size in bytes (for sharding) and how to produce it when its shard is written."""
    nbytes: int
    read: Callable[[], torch.Tensor]


def parse_size(size: int | str) -> int:
    """`5GB` -> 5·10⁹ bytes, `2GiB` -> 2·2³⁰, an int is bytes."""
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*([\d.]+)\s*([A-Za-z]*)\s*", size)
    if m is None or m.group(2).upper() not in _UNITS:
        raise ValueError(f"max_shard_size={size!r} is not a size like '5GB', '500MB' or '2GiB'")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def plan_shards(sizes: dict[str, int], max_bytes: int) -> list[list[str]]:
    """Greedy shards in key order; a tensor larger than max_bytes gets a shard of its own."""
    shards: list[list[str]] = [[]]
    filled = 0
    for key, n in sizes.items():
        if shards[-1] and filled + n > max_bytes:
            shards.append([])
            filled = 0
        shards[-1].append(key)
        filled += n
    return shards


def _standalone(t: torch.Tensor) -> torch.Tensor:
    """CPU, contiguous, owning its storage (safetensors refuses tensors that share storage)."""
    t = t.detach().to("cpu").contiguous()
    if t.storage_offset() or t.untyped_storage().nbytes() != t.nbytes:
        t = t.clone()
    return t


def _save(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_file({k: _standalone(v) for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def write_weights(directory: Path, pending: dict[str, PendingTensor], max_shard_size: int | str) -> None:
    """Backbone tensors -> `model.safetensors`, or shards plus `model.safetensors.index.json`."""
    shards = plan_shards({k: p.nbytes for k, p in pending.items()}, parse_size(max_shard_size))
    if len(shards) == 1:
        _save({k: pending[k].read() for k in shards[0]}, directory / WEIGHTS_FILE)
        return
    weight_map = {}
    for i, keys in enumerate(shards):
        name = shard_name(i, len(shards))
        _save({k: pending[k].read() for k in keys}, directory / name)
        weight_map.update(dict.fromkeys(keys, name))
    index = {"metadata": {"total_size": sum(p.nbytes for p in pending.values())}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def write_block_files(directory: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Block-mode parameters -> the conv-right and softmax-scalar bd_gdn_* files (SPEC §9)."""
    for file in (CONV_RIGHT_FILE, SCALARS_FILE):
        _save({k: v for k, v in tensors.items() if block_file(k) == file}, directory / file)


def write_config(directory: Path, config, architecture: str, dtype: torch.dtype) -> None:
    """`config.json` with `architectures`, `auto_map` (for trust_remote_code) and `dtype`."""
    config = copy.deepcopy(config)
    config.architectures = [architecture]
    config.auto_map = dict(AUTO_MAP)
    config.dtype = dtype
    config.to_json_file(str(directory / CONFIG_FILE), use_diff=True)


def write_generation_config(directory: Path, settings) -> None:
    """`generation_config.json`: `settings` (a dict, or a `GenerationConfig`'s non-default values) merged
    over the file already in `directory`. Left out: `_from_model_config` (transformers drops every
    custom field, e.g. `threshold`, of a file that carries it) and the neutral flags transformers
    would warn about on every load (`top_k: 0` beside greedy decoding; see `without_neutral_settings`)."""
    if not isinstance(settings, dict):
        settings = settings.to_diff_dict()
    path = Path(directory) / GENERATION_CONFIG_FILE
    current = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    merged = without_neutral_settings({**current, **settings})
    merged.pop("_from_model_config", None)
    path.write_text(json.dumps(merged, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")


def copy_model_code(directory: Path) -> None:
    """Copy every `*.py` of this flat model bundle so `trust_remote_code=True` can load the dir."""
    for source in sorted(Path(__file__).parent.glob("*.py")):
        shutil.copy2(source, directory / source.name)


def _keep_old_files(old: Path, new: Path) -> None:
    """Carry over what an old checkpoint dir holds besides weights and code (tokenizer, README, …)."""
    for entry in old.iterdir():
        if (new / entry.name).exists() or _REPLACED.fullmatch(entry.name):
            continue
        if entry.is_dir():
            shutil.copytree(entry, new / entry.name, symlinks=True)
        else:
            shutil.copy2(entry, new / entry.name, follow_symlinks=False)


# a temporary sibling of `target`: .<target>.tmp-<pid>-<hex> (new contents) or .old-<pid>-<hex> (the
# replaced dir during the swap); "<pid>-" is absent in names written by older versions
_SIBLING = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old)-(?:(?P<pid>\d+)-)?[0-9a-f]{8}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True


def remove_stale_siblings(target: str | Path) -> list[Path]:
    """Delete the temporary siblings of `target` that a killed save or conversion left behind (their
    process is gone, or they predate process tags); a `.old-*` dir whose swap was cut short before
    the new dir moved in is put back as `target`. Returns what was removed."""
    target = Path(os.path.abspath(target))
    if not target.parent.is_dir():
        return []
    removed = []
    for entry in sorted(target.parent.iterdir()):
        match = _SIBLING.fullmatch(entry.name)
        if not match or match["name"] != target.name or not entry.is_dir():
            continue
        if match["pid"] is not None and _alive(int(match["pid"])):
            continue
        if match["kind"] == "old" and not target.exists():
            os.replace(entry, target)
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


@contextmanager
def atomic_directory(target: str | Path, keep_other_files: bool = False) -> Iterator[Path]:
    """Yield an empty sibling directory to write into; on success it replaces `target`.

    On an exception the sibling is deleted and `target` is untouched. With `keep_other_files`, files
    of an existing `target` that the new contents neither write nor supersede (tokenizer files, …)
    are copied over. The swap is two renames (old aside, new in), then the old dir is deleted.
    Siblings left by a killed earlier run are removed first (`remove_stale_siblings`)."""
    target = Path(os.path.abspath(target))
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"{target} exists and is not a directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_siblings(target)
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp = target.parent / f".{target.name}.tmp-{tag}"
    tmp.mkdir()
    try:
        yield tmp
        if keep_other_files and target.exists():
            _keep_old_files(target, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not target.exists():
        os.replace(tmp, target)
        return
    old = target.parent / f".{target.name}.old-{tag}"
    os.replace(target, old)
    try:
        os.replace(tmp, target)
    except BaseException:
        os.replace(old, target)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
