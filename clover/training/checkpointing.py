"""Training checkpoints in a run directory: everything an exact resume needs, and no pickle.

Layout: `RUN/checkpoints/step-0000123/`, a folder holding
  - `*.safetensors`: the model parameters and the optimizer's tensors (AdamW moments and step
    counts), written with `torch.distributed.checkpoint` (DCP) through its safetensors storage:
    each rank writes its own shards (FSDP) or rank 0 the whole (single process, DDP), and any
    world size reads them back, re-sliced for its own sharding;
  - `trainer.json`: the step (also the data position, see `PairDataset`), run counters, the
    train config, the scheduler state, the optimizer's hyper-parameters per group and the RNG
    states (python, numpy, torch CPU and CUDA) as plain lists.
Nothing in a checkpoint is unpickled: safetensors and JSON only (DCP's default storage pickles
its metadata, so it is not used). A checkpoint is written to `step-N.tmp/` and renamed, so a
crash never leaves a half-written checkpoint under a final name.
"""

import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from .distributed import DistInfo, barrier

_NAME = re.compile(r"^step-(\d+)$")
_LEGACY = re.compile(r"^step-(\d+)\.pt$")
STATE_FILE = "trainer.json"
FORMAT = 2  # 1 was a pickled `step-N.pt`, refused since it can run code


# -- RNG states as JSON -------------------------------------------------------------------------------

def capture_rng() -> dict:
    version, keys, gauss = random.getstate()
    kind, mt, pos, has_gauss, cached = np.random.get_state()
    cuda = [s.tolist() for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else []
    return {"python": [version, list(keys), gauss],
            "numpy": [kind, mt.tolist(), int(pos), int(has_gauss), float(cached)],
            "torch": torch.get_rng_state().tolist(), "cuda": cuda}


def restore_rng(state: dict) -> None:
    version, keys, gauss = state["python"]
    random.setstate((version, tuple(keys), gauss))
    kind, mt, *rest = state["numpy"]
    np.random.set_state((kind, np.asarray(mt, dtype=np.uint32), *rest))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


# -- finding checkpoints ---------------------------------------------------------------------------------

def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of complete checkpoints, oldest first."""
    directory = checkpoint_dir(run_dir)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir()
             if (m := _NAME.match(p.name)) and (p / STATE_FILE).is_file()]
    return sorted(found)


def legacy_checkpoints(run_dir: str | Path) -> list[Path]:
    """Pickled `step-N.pt` files of older versions: never loaded (unpickling can run code)."""
    directory = checkpoint_dir(run_dir)
    return sorted(p for p in directory.iterdir() if _LEGACY.match(p.name)) if directory.is_dir() else []


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


# -- model + optimizer tensors through DCP -----------------------------------------------------------------

def _tensor_state(model, optimizer) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """Flat {name: tensor} of the model and optimizer (DTensor shards under FSDP) and the
    optimizer's param groups (hyper-parameters, parameter names) without tensors."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    tensors, storages = {}, set()
    for k, v in model_sd.items():
        local = v.to_local() if hasattr(v, "to_local") else v
        storage = local.untyped_storage().data_ptr()
        # tied weights (tie_word_embeddings) share storage, which safetensors refuses: the second
        # name gets its own copy (equal values; loading writes the one parameter twice)
        tensors[f"model.{k}"] = v.clone() if storage in storages else v
        storages.add(storage)
    for fqn, values in optim_sd["state"].items():
        for name, value in values.items():
            tensors[f"optim.{fqn}.{name}"] = value
    return tensors, optim_sd["param_groups"]


def _json_groups(groups: list[dict]) -> list[dict]:
    return [{k: (v.item() if isinstance(v, torch.Tensor) else v) for k, v in g.items()} for g in groups]


def save_checkpoint(run_dir: str | Path, step: int, model, optimizer, meta: dict, dist: DistInfo,
                    keep: int = 2) -> Path:
    """Collective: every rank calls it. Writes `step-N/` (tensors + `trainer.json` with `meta`),
    then keeps only the newest `keep` checkpoints (0 keeps all)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    final = checkpoint_dir(run_dir) / f"step-{step:07d}"
    tmp = final.with_name(final.name + ".tmp")
    if dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(dist)
    tensors, groups = _tensor_state(model, optimizer)
    dcp.save(tensors, storage_writer=HuggingFaceStorageWriter(str(tmp), save_distributed=True),
             no_dist=not dist.enabled)
    if dist.is_main:
        state = {"format": FORMAT, **meta, "optimizer_param_groups": _json_groups(groups),
                 "world_size": dist.world_size}
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        if keep:
            for _, old in list_checkpoints(run_dir)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    barrier(dist)
    return final


def read_meta(path: str | Path) -> dict:
    state = json.loads((Path(path) / STATE_FILE).read_text(encoding="utf-8"))
    if state.get("format") != FORMAT:
        raise ValueError(f"{path}: checkpoint format {state.get('format')!r}, expected {FORMAT}")
    return state


def load_checkpoint(path: str | Path, model, optimizer, dist: DistInfo) -> dict:
    """Collective: load the tensors of checkpoint `path` into `model` and `optimizer` (any world
    size, any strategy); returns the `trainer.json` state (scheduler, RNG, counters)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = read_meta(path)
    tensors, groups = _tensor_state(model, optimizer)  # templates (creates AdamW state if none yet)
    reader = HuggingFaceStorageReader(str(path))
    saved = set(reader.read_metadata().state_dict_metadata)
    missing = sorted(k for k in tensors if k.startswith("model.") and k not in saved)
    if missing:
        raise ValueError(f"{path}: the checkpoint has no tensor for {len(missing)} of this model's "
                         f"parameters, e.g. {missing[0][len('model.'):]}")
    # AdamW makes a parameter's state at its first gradient, so a parameter that never had one (the
    # block-mode-only weights of an AR-only run) has none saved: it keeps the template's fresh state
    dcp.load({k: v for k, v in tensors.items() if k in saved},  # in place, into the templates
             storage_reader=reader, no_dist=not dist.enabled)
    model_sd = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    optim_state: dict[str, dict] = {}
    names = {fqn for g in groups for fqn in g["params"]}
    for key, value in tensors.items():
        if key.startswith("optim."):
            fqn, name = key[len("optim."):].rsplit(".", 1)
            assert fqn in names, key
            optim_state.setdefault(fqn, {})[name] = value
    saved_groups = state["optimizer_param_groups"]
    if [g["params"] for g in saved_groups] != [g["params"] for g in groups]:
        raise ValueError(f"{path}: the optimizer's parameters differ from this model's")
    set_state_dict(model, optimizer, model_state_dict=model_sd,
                   optim_state_dict={"state": optim_state, "param_groups": saved_groups})
    return state


def load_model_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """The full model parameters of a checkpoint, without a model or process group (inspection,
    tests): reassembled from every rank's shards."""
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no checkpoint here (no *.safetensors files)")
    out: dict[str, torch.Tensor] = {}
    pieces: dict[str, list] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            info = json.loads((f.metadata() or {}).get("DCP_SHARDING_INFO", "{}"))
            for key in f.keys():
                if key.startswith("model."):
                    pieces.setdefault(key[len("model."):], []).append((info[key], f.get_tensor(key)))
    for name, parts in pieces.items():
        out[name] = _assemble(parts)
    return out


def check_fits(own: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor], source: str | Path) -> None:
    """Refuse (ValueError) `tensors` whose names or shapes are not those of the state dict `own`,
    naming the first few that differ."""
    missing, extra = sorted(own.keys() - tensors.keys()), sorted(tensors.keys() - own.keys())
    shapes = sorted(k for k in own.keys() & tensors.keys() if own[k].shape != tensors[k].shape)
    if missing or extra or shapes:
        raise ValueError(f"{source} does not fit this model: missing {missing[:3]}, "
                         f"unexpected {extra[:3]}, other shapes {shapes[:3]}")


def _assemble(parts: list) -> torch.Tensor:
    """Place each shard at its saved offsets in the full tensor."""
    first = parts[0][1]
    size = [max(info["saved_offsets"][d] + t.shape[d] for info, t in parts) for d in range(first.dim())]
    out = torch.empty(size, dtype=first.dtype)
    for info, t in parts:
        out[tuple(slice(o, o + s) for o, s in zip(info["saved_offsets"], t.shape))] = t
    return out
