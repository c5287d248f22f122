"""Scorers on hand-made outputs: right, wrong, malformed; never raising."""

from __future__ import annotations

import json

import pytest

from clover.data.tasks import TASKS, Example, get_task

GARBAGE = ["", "   ", "<|im_end|>", "not json at all {[", "[{]", "null", "42", "\x00\xff", "1:maybe 2:"]


@pytest.mark.parametrize("name", sorted(TASKS))
def test_scorer_never_raises_on_garbage(name):
    task = get_task(name)
    ex = task.generate(5, "eval")
    for text in GARBAGE:
        result = task.score(ex, text)
        assert result["correct"] is False


@pytest.mark.parametrize("name", sorted(TASKS))
def test_answer_with_chat_wrapping_is_right(name):
    task = get_task(name)
    ex = task.generate(7, "eval")
    assert task.score(ex, "<think>\n\n</think>\n\n" + ex.answer + "<|im_end|>")["correct"] is True


def _airspace(zones: list[dict]) -> Example:
    return Example("p", json.dumps(zones, separators=(",", ":")), "airspace", {"zones": zones})


ZONES = [
    {"id": "Z12", "location": "Old Town", "radius_km": 3.0, "start": "08:00", "end": "11:30"},
    {"id": "Z40", "location": "31.24N 121.47E", "radius_km": 0.5, "start": "13:15", "end": "17:15"},
]


def test_airspace_scores():
    task, ex = get_task("airspace"), _airspace(ZONES)
    right = task.score(ex, '[{"id":"Z12","location":"Old Town","radius_km":3,"start":"08:00","end":"11:30"},'
                           ' {"end":"17:15","id":"Z40","location":"31.24N 121.47E","radius_km":0.5,"start":"13:15"}]')
    all_right = {f: [2, 2] for f in ("id", "location", "radius_km", "start", "end", "no_extra")}
    assert right == {"correct": True, "valid_json": True, "zone_f1": 1.0, "fields": all_right}
    wrong = task.score(ex, json.dumps([ZONES[0], {**ZONES[1], "radius_km": 0.6}]))
    assert wrong["correct"] is False and wrong["valid_json"] is True and wrong["zone_f1"] == 0.5
    assert wrong["fields"]["radius_km"] == [1, 2] and wrong["fields"]["location"] == [2, 2]
    swapped = task.score(ex, json.dumps(ZONES[::-1]))
    assert swapped["correct"] is False and swapped["zone_f1"] == 1.0
    malformed = task.score(ex, json.dumps(ZONES)[:-1])
    assert {k: malformed[k] for k in ("correct", "valid_json", "zone_f1")} == {
        "correct": False, "valid_json": False, "zone_f1": 0.0}
    assert malformed["fields"]["id"] == [0, 2]
    assert task.score(ex, '{"id":"Z12"}')["correct"] is False
    assert task.score(ex, "[1, [2], null]")["zone_f1"] == 0.0


def test_airspace_empty_list():
    task, ex = get_task("airspace"), _airspace([])
    assert task.score(ex, "[]")["correct"] is True
    assert task.score(ex, json.dumps(ZONES))["correct"] is False


def test_joint_scores():
    task = get_task("joint")
    ex = Example("p", "1:yes 2:no 3:yes", "joint", {"answers": [True, False, True]})
    assert task.score(ex, "1:yes 2:no 3:yes") == {"correct": True, "item_accuracy": 1.0, "n_items": 3,
                                                  "fields": {"fact": [3, 3]}}
    assert task.score(ex, "1: Yes  2:NO 3:yes")["correct"] is True
    half = task.score(ex, "1:yes 2:yes 3:no")
    assert half["correct"] is False and half["item_accuracy"] == pytest.approx(1 / 3)
    derived = Example("p", "1:yes 2:no 3:yes", "joint",
                      {"answers": [True, False, True], "derived": [False, True, True]})
    assert task.score(derived, "1:yes 2:yes 3:yes")["fields"] == {"fact": [1, 1], "derived": [1, 2]}
    missing = task.score(ex, "1:yes 2:no")
    assert missing["correct"] is False and missing["item_accuracy"] == pytest.approx(2 / 3)
    extra = task.score(ex, "1:yes 2:no 3:yes 4:no")
    assert extra["correct"] is False and extra["item_accuracy"] == 1.0
    assert task.score(ex, "1:yes 1:no 2:no 3:yes")["correct"] is True  # first answer counts
    assert task.score(ex, "yes no yes")["item_accuracy"] == 0.0


def test_record_scores():
    task = get_task("record")
    ex = task.generate(0, "train")
    assert task.score(ex, "  " + ex.answer + "\n")["correct"] is True
    words = ex.answer.split()
    words[3] = "Nobody"
    wrong = task.score(ex, " ".join(words))
    assert wrong["correct"] is False and wrong["token_overlap"] == pytest.approx(1 - 1 / len(words))
    assert wrong["fields"]["pilot"] == [0, 1] and wrong["fields"]["site"] == [1, 1]
    assert task.score(ex, ex.answer[:-1])["correct"] is False


def test_airspace_field_counts_amendments_and_cancellations():
    task = get_task("airspace", min_notices=4, max_notices=4)
    seen = set()
    for seed in range(60):
        ex = task.generate(seed, "eval")
        fields = task.score(ex, ex.answer)["fields"]
        assert all(right == total for right, total in fields.values())
        seen |= set(fields)
        if "cancelled" in fields:  # leaving a cancelled zone in is caught by its field
            cancelled = next(z for z, kind in ex.meta["modified"].items() if kind == "cancel")
            stale = json.loads(ex.answer) + [{"id": cancelled}]
            assert task.score(ex, json.dumps(stale))["fields"]["cancelled"][0] < fields["cancelled"][1]
    assert {"amended", "cancelled", "no_extra"} <= seen
