"""`clover average`: the uniform mean of several checkpoints' weights (a "model soup").

Runs that start from one checkpoint and train apart (other data seeds, learning rates) can stay in
one basin, and then the mean of their weights is often better than each of them (Wortsman et al.,
2022, "Model soups"). Measured on the embedded model's lineage (BENCHMARKS.md, "Weight averages"):
two 5,600-step runs at lr 5e-4 and 3e-4 average 0.6-0.8 points above each; two at 5e-4 and 1e-3
average below both. The tail of one run (its last trainer checkpoints) can be averaged the same way.

Each source is a Clover checkpoint folder (a `config.json` of model type `clover_moe`) or a trainer checkpoint
(`OUT/checkpoints/step-N`, weights only). The output takes its config, tokenizer and generation
defaults from `base` (by default the first source, which must then be a checkpoint folder) and is
written atomically: a failure leaves no half-written folder, and an existing output is replaced only
when it is itself a checkpoint folder.
"""

import shutil
from pathlib import Path

import torch

from clover.checkpoint.convert import is_clover_checkpoint
from clover.checkpoint.tokenizer_files import TOKENIZER_FILES
from clover.model import CloverMoeForCausalLM
from clover.model.checkpoint_save import atomic_directory

from .checkpointing import check_fits, load_model_tensors

CARRIED_FILES = (*TOKENIZER_FILES, "generation_config.json")


def source_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """A source's full state dict: a checkpoint folder's model, or a trainer checkpoint's tensors."""
    if is_clover_checkpoint(Path(path)):
        return CloverMoeForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
    return load_model_tensors(path)


def mean_state(base: dict[str, torch.Tensor], sources: list[str | Path]) -> dict[str, torch.Tensor]:
    """The mean of the sources' floating tensors (summed in float64, cast to the base's dtypes);
    other tensors are the base's."""
    sums: dict[str, torch.Tensor] = {}
    for source in sources:
        tensors = source_tensors(source)
        check_fits(base, tensors, source)
        for name, tensor in tensors.items():
            if base[name].is_floating_point():
                sums[name] = sums.get(name, 0) + tensor.to(torch.float64)
    return {name: (sums[name] / len(sources)).to(t.dtype) if name in sums else t for name, t in base.items()}


def average_checkpoints(sources: list[str | Path], dst: str | Path, base: str | Path | None = None) -> Path:
    """Write the mean of `sources`' weights as a checkpoint folder `dst` with `base`'s config and
    files. Refused before anything is written: no source, a base that is not a checkpoint folder, a
    source that does not fit the base (ValueError), a `dst` that is neither empty nor a checkpoint
    folder (FileExistsError: it would be replaced whole)."""
    if not sources:
        raise ValueError("average: no source checkpoint given")
    if Path(dst).is_dir() and any(Path(dst).iterdir()) and not is_clover_checkpoint(Path(dst)):
        raise FileExistsError(f"output {dst} is a non-empty folder that is no Clover checkpoint; "
                              "give a new or empty folder, or a checkpoint folder to replace")
    base = sources[0] if base is None else base
    if not is_clover_checkpoint(Path(base)):
        raise ValueError(f"base {base} is not a Clover checkpoint folder (no config.json of a Clover model); a trainer "
                         "checkpoint needs --base, the checkpoint folder its run started from")
    model = CloverMoeForCausalLM.from_pretrained(base, dtype="auto")
    stored = model.dtype
    model.float()  # the mean is taken and loaded in fp32, then stored in the base's dtype
    model.load_state_dict(mean_state(model.state_dict(), sources), strict=True)
    return save_like(model.to(stored), base, dst)


def save_like(model, base: str | Path, dst: str | Path) -> Path:
    """Write `model` as a checkpoint folder `dst` that carries `base`'s tokenizer and generation
    defaults (`CARRIED_FILES`); written whole or not at all."""
    with atomic_directory(dst) as tmp:
        model.save_pretrained(tmp)
        for name in CARRIED_FILES:
            if (Path(base) / name).is_file():
                shutil.copy2(Path(base) / name, tmp / name)
    return Path(dst)
