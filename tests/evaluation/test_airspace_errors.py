"""`benchmarks/airspace_errors.py` names the first part of an `airspace` answer that went wrong."""

import json
import random
import re

import pytest
import torch

from clover.data import eval_examples, get_task
from clover.data.corpus import format_chat
from clover.data.tasks.airspace import AirspaceTask
from benchmark_script import load_benchmark

airspace_errors = load_benchmark("airspace_errors")
# `checks`, or the radius written after each status, or each amended zone's notice as its status
LAYOUTS = ["", "listed", "paired", "radii", "amendments"]


def _options(layout: str) -> dict:
    return {layout: True} if layout in ("radii", "amendments") else {"checks": layout}


def _example(**options):
    """An airspace example with an active zone and a radius amendment."""
    task, rng = AirspaceTask(min_notices=3, **options), random.Random(0)
    while True:
        example = task.sample(rng)
        kinds = example.meta["modified"].values()
        if "radius" in kinds and len(example.meta["zones"]) > len(kinds):
            return example


def _output(lines, zones):
    return "<think>\n" + "\n".join(lines) + "\n</think>\n\n" + json.dumps(zones, separators=(",", ":"))


@pytest.mark.parametrize("checks", LAYOUTS)
def test_each_part_of_an_answer_is_told_apart(checks):
    example = _example(**_options(checks))
    lines, zones = example.reasoning.splitlines(), example.meta["zones"]
    amended = next(z for z, kind in example.meta["modified"].items() if kind == "radius")
    active = next(z["id"] for z in zones if z["id"] not in example.meta["modified"])
    swapped = [re.sub("(?i)amended.*", "active.", line) if line.startswith(amended) else
               line.replace("active", "amended") if line.startswith(active) else line for line in lines]
    assert airspace_errors.first_error(_output(swapped, zones), example) == (
        "status", ", ".join(f"{z} amended->active" if z == amended else f"{z} active->amended"
                            for z in (line.split()[0].rstrip(":") for line in lines) if z in (amended, active)))
    assert airspace_errors.first_error(_output(lines[1:], zones), example)[0] == "lines"
    assert airspace_errors.first_error(_output(lines, zones[1:]), example)[0] == "zones"
    assert airspace_errors.first_error(_output(lines, zones)[:-1], example)[0] == "json"

    def with_field(zone_id, field, value):
        return [dict(z, **{field: value}) if z["id"] == zone_id else z for z in zones]

    got = airspace_errors.first_error(_output(lines, with_field(amended, "radius_km", 99.9)), example)
    assert got[0] == "field" and got[1].startswith(f"radius_km (amended) of {amended}: 99.9")
    got = airspace_errors.first_error(_output(lines, with_field(active, "location", "Nowhere")), example)
    assert got[0] == "field" and got[1].startswith(f"location (copied) of {active}: 'Nowhere'")


@pytest.mark.parametrize("checks", LAYOUTS)
def test_answer_spans_cover_each_status_word_and_value(tokenizer, checks):
    """The teacher-forced table labels the chat answer's characters: each status span is that
    line's status word (the last word, after the checks), each value span a JSON value, amended
    exactly where a modifier replaced it."""
    example = _example(**_options(checks))
    assert (": Z" in example.reasoning) == (checks in ("listed", "paired"))
    assert (" km." in example.reasoning) == (checks == "radii")
    assert (" AMENDED: radius now " in example.reasoning) == (checks == "amendments")
    answer = format_chat(tokenizer, example, enable_thinking=True).answer
    spans = airspace_errors.answer_spans(example, answer)
    statuses = [re.sub(r", [^,]* km\.$|: radius now .*", "", line).split()[-1].rstrip(".")  # what follows, cut
                for line in example.reasoning.splitlines()]
    assert [answer[a:b] for row, a, b in spans if row.startswith("status")] == statuses
    assert [row for row, _, _ in spans if row.startswith("status")] == [f"status {s.lower()}" for s in statuses]
    assert [answer[a:b] for row, a, b in spans if row == "check no"] == ["no"] * example.reasoning.count(" no,")
    values = [(row, answer[a:b]) for row, a, b in spans if row.startswith("value")]
    assert len(values) == 5 * len(example.meta["zones"])
    amended = next(z for z, kind in example.meta["modified"].items() if kind == "radius")
    radius = next(z["radius_km"] for z in example.meta["zones"] if z["id"] == amended)
    assert [v for row, v in values if row == "value amended"] == [str(radius)]


def test_teacher_forced_table_counts_every_status_token(model, tokenizer):
    """On a tiny random model: the status rows count each status word's tokens (the task tokenizer
    splits a word the same way wherever it stands), and the value rows cover every zone's values."""
    n_tokens = {w: len(tokenizer(w, add_special_tokens=False).input_ids) for w in ("active", "amended", "cancelled")}
    examples = eval_examples(3, seed=0, tasks=[get_task("airspace")])
    with torch.inference_mode():
        rows = airspace_errors.teacher_forced_table(model, tokenizer, examples)
    counts = {" ".join(row.split()[:2]): int(row.split()[-1]) for row in rows[1:]}
    lines = [line for e in examples for line in e.reasoning.splitlines()]
    statuses = [line.split()[1].rstrip(".") for line in lines]
    for status, n in n_tokens.items():
        assert counts.get(f"status {status}", 0) == n * statuses.count(status)
    assert counts["value copied"] + counts.get("value amended", 0) >= 5 * sum(len(e.meta["zones"]) for e in examples)


def test_modifier_next_marks_the_zone_right_above_a_modifier():
    """Seed 3's third prompt: Z47 is cancelled by the last notice, which comes right after Z38's."""
    example = eval_examples(40, seed=3, tasks=[get_task("airspace")])[2]
    assert airspace_errors.modifier_next(example) == {"Z43": False, "Z47": False, "Z38": True}
    answer = example.reasoning + "\n</think>\n\n" + example.answer
    rows = [row for row, _, _ in airspace_errors.answer_spans(example, answer)]
    assert rows[:6] == ["status active", "active, modifier apart", "status cancelled",
                        "cancelled, modifier apart", "status active", "active, modifier next"]
