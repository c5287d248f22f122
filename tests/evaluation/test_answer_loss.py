"""`benchmarks/answer_loss.py`: per-group statistics of answer losses, and a run on the embedded model."""

import math
from pathlib import Path

import pytest
from benchmark_script import load_benchmark

from clover import default_model_dir

probe = load_benchmark("answer_loss")
RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "mine_a_cpu.json"


def test_group_stats_mean_median_and_likely_share():
    stats = probe.group_stats([0.1, 0.5, 3.0, 2.0, math.log(2)], ["b", "b", "b", "a", "a"])
    assert list(stats) == ["a", "b"]
    assert stats["b"] == pytest.approx((3.6 / 3, 0.5, 2 / 3))
    assert stats["a"] == pytest.approx(((2.0 + math.log(2)) / 2, (2.0 + math.log(2)) / 2, 0.0))  # ln 2 is not < ln 2


def test_a_run_prints_one_row_per_task_and_turn(capsys):
    probe.main([str(default_model_dir()), "--recipe", str(RECIPE), "--pool", "12",
                "--threads", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "(" in line]
    assert rows and all(len(row.split("|")) == 5 for row in rows)
    assert sum(int(row.split("|")[2]) for row in rows) == 12
