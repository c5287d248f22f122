"""`benchmarks/roster_lookups.py` spans each part of a named-roster line and counts each once per mode."""

import pytest
import torch

from clover.data import eval_examples, get_task
from benchmark_script import load_benchmark

roster_lookups = load_benchmark("roster_lookups")


@pytest.mark.parametrize("line, values", [
    ("2. Is Kim cleared? Anyone who is licensed and rested is cleared. Kim licensed=no, Kim rested=yes. no",
     ["no", "yes"]),
    ("2. Is Kim cleared? Anyone who is licensed and rested is cleared. Kim licensed-, Kim rested+. no",
     ["-", "+"]),
])
def test_parts_span_the_rule_each_lookup_and_the_verdict(line, values):
    found = [(part, line[a:b]) for part, a, b in roster_lookups.parts(line)]
    words = {"no": "no", "yes": "yes", "-": "no", "+": "yes"}
    assert found == [
        ("rule", "Anyone who is licensed and rested is cleared."),
        ("key", "Kim licensed"), (f"value {words[values[0]]}", values[0]),
        ("key", "Kim rested"), (f"value {words[values[1]]}", values[1]),
        ("verdict", "no")]
    base = roster_lookups.parts("1. Is Kim rested? Kim rested+. yes")
    assert [part for part, _, _ in base] == ["key", "value yes", "verdict"]


@pytest.mark.parametrize("form", ["named", "marked"])
def test_table_counts_every_line_once_per_mode(model, tokenizer, form):
    examples = eval_examples(3, seed=0, tasks=[get_task("joint", facts=form)])
    with torch.inference_mode():
        rows = roster_lookups.table(model, tokenizer, examples)
    lines = [line for e in examples for line in e.reasoning.split("\n")]
    values = sum(part.startswith("value") for line in lines for part, _, _ in roster_lookups.parts(line))
    for row in rows[1:]:
        counts = row.split()[1:]
        pairs = [(int(counts[k]), int(counts[k + 2])) for k in range(0, len(counts), 3)]
        assert all(right <= n for right, n in pairs)
        named = dict(zip(roster_lookups.PARTS, pairs))
        assert named["line"][1] == named["verdict"][1] == len(lines)
        assert named["value yes"][1] + named["value no"][1] == values
