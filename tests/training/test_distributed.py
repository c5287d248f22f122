"""Two-process torchrun smoke test (gloo, CPU): the run finishes and both ranks end identical."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.training.conftest import DIGITS_MODEL

ROOT = Path(__file__).resolve().parents[2]


def digits_recipe(output_dir: Path, steps: int, batch_size: int = 8) -> dict:
    model = {k: v for k, v in DIGITS_MODEL.items()
             if k not in ("mask_token_id", "eos_token_id", "pad_token_id")}
    return {"name": "digits-smoke", "output_dir": str(output_dir), "num_threads": 1,
            "model": {"config": model},
            "data": {"source": "digits", "n_eval_per_task": 8, "digits": {"min_len": 2, "max_len": 5}},
            "train": {"steps": steps, "batch_size": batch_size, "block_size": 4, "lr": 5e-3,
                      "warmup_steps": 1, "log_interval": 1, "eval_interval": 2}}


def test_torchrun_two_ranks_agree(tmp_path):
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(digits_recipe(tmp_path / "run", steps=4)))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "tests/training/ddp_worker.py"), str(recipe), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]

    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert ranks[0]["step"] == ranks[1]["step"] == 4
    assert ranks[0]["loss"] == ranks[1]["loss"]  # the logged loss is the mean over ranks
    for name, a in ranks[0]["params"].items():
        assert torch.equal(a, ranks[1]["params"][name]), name
    run = tmp_path / "run"
    assert (run / "final" / "config.json").exists()
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-0000004"]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert sum("loss" in x for x in lines) == 4  # rank 0 alone logs
