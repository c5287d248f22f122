"""`benchmarks/paired_loss.py`: runs compared step by step over the steps all of them logged."""

import json

from benchmark_script import load_benchmark

probe = load_benchmark("paired_loss")


def _run(path, losses: dict[int, float]):
    path.mkdir()
    lines = [json.dumps({"step": step, "l_ar": loss, "lr": 1e-3}) for step, loss in losses.items()]
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path


def test_windows_average_the_shared_steps_and_count_where_each_run_is_lower(tmp_path):
    base = probe.losses(_run(tmp_path / "a", {1: 1.0, 2: 0.5, 3: 0.4, 4: 0.2}), "l_ar")
    other = probe.losses(_run(tmp_path / "b", {1: 0.8, 2: 0.6, 3: 0.3}), "l_ar")  # stopped at step 3
    rows = probe.windows([base, other], window=2)
    assert [(first, last) for first, last, _, _ in rows] == [(1, 2), (3, 3)]
    assert rows[0][2] == [0.75, 0.7] and rows[0][3] == [0.0, 0.5]
    assert rows[1][2] == [0.4, 0.3] and rows[1][3] == [0.0, 1.0]


def test_a_resumed_step_counts_its_last_line(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "l_ar": 2.0}\n{"step": 1, "l_ar": 1.5}\n')
    assert probe.losses(run, "l_ar") == {1: 1.5}
