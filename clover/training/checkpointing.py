"""Training checkpoints in a run directory: everything an exact resume needs, written atomically.

Layout: `RUN/checkpoints/step-0000123.pt`, each a dict with the model and optimizer state dicts,
the scheduler state, the RNG states (python, numpy, torch CPU and CUDA), the step (which is also
the data position, see `PairDataset`) and run counters. A file is written to `*.tmp` and renamed,
so a crash never leaves a truncated checkpoint under a final name.
"""

import os
import random
import re
from pathlib import Path

import numpy as np
import torch

_NAME = re.compile(r"^step-(\d+)\.pt$")


def capture_rng() -> dict:
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(state: dict) -> None:
    random.setstate(state["python"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of complete checkpoints, oldest first."""
    directory = checkpoint_dir(run_dir)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def save_checkpoint(run_dir: str | Path, step: int, payload: dict, keep: int = 2) -> Path:
    """Write `payload` as the checkpoint of `step` (tmp + fsync + rename), then keep only the
    newest `keep` checkpoints (0 keeps all)."""
    directory = checkpoint_dir(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step-{step:07d}.pt"
    tmp = final.with_name(final.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    if keep:
        for _, old in list_checkpoints(run_dir)[:-keep]:
            old.unlink(missing_ok=True)
    return final


def load_checkpoint(path: str | Path) -> dict:
    # our own files: they hold python RNG tuples and plain dicts besides tensors
    return torch.load(path, map_location="cpu", weights_only=False)
