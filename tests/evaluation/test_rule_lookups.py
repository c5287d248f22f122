"""`benchmarks/rule_lookups.py` finds each copied rule and says where a wrong token comes from."""

import random

import pytest
import torch

from clover.data import eval_examples, get_task
from benchmark_script import load_benchmark

rule_lookups = load_benchmark("rule_lookups")


def _joint_with_rules():
    task, rng = get_task("joint", min_questions=3, max_questions=4), random.Random(0)
    while True:
        example = task.sample(rng)
        if sum(example.meta["derived"]) >= 2:
            return example


def test_a_joint_derivation_s_rule_copies_span_conditions_to_the_rule_s_end():
    example = _joint_with_rules()
    rules = rule_lookups.prompt_rules(example.prompt)
    copies = rule_lookups.rule_copies(example.reasoning)
    assert len(copies) == sum(example.meta["derived"]) >= 2
    for a, b, asked, fact, place in copies:
        assert example.reasoning[a:b] == f"{rules[asked]} is {asked}." and place == "1st, behind"
        line = next(line for line in example.reasoning.splitlines() if f" {asked}? " in line and fact in line)
        assert line.split("? ")[1].startswith(fact)


def test_a_scan_line_s_every_rule_is_a_copy_under_its_own_property():
    task, rng = get_task("joint", min_questions=3, max_questions=4, derive="scan"), random.Random(0)
    example = next(e for e in iter(lambda: task.sample(rng), None) if e.reasoning.count("Anyone") >
                   sum(e.meta["derived"]))  # a line that scans past a rule
    rules = rule_lookups.prompt_rules(example.prompt)
    copies = rule_lookups.rule_copies(example.reasoning)
    assert len(copies) == example.reasoning.count("Anyone") > sum(example.meta["derived"])
    for a, b, prop, _, place in copies:
        assert example.reasoning[a:b] == f"{rules[prop]} is {prop}."
    places = {place for *_, place in copies}  # two rules: a scan passes the first or stops at it
    assert {"1st, passed", "2nd, behind"} <= places <= {"1st, behind", "1st, passed", "2nd, behind"}


@pytest.mark.parametrize("line_rules", ["keyed", "both", "keyed_first", "keyed_before_fact"])
def test_a_keyed_line_s_one_copy_is_its_keyed_rule(line_rules):
    """A line that writes its rule keyed, alone or before the rule's sentence, has one copy: the keyed
    one, from its first condition to its full stop (the sentence after it copies that copy); its fact
    line is the pilot's, wherever the keyed copy stands."""
    task, rng = get_task("joint", min_questions=3, max_questions=4, line_rules=line_rules), random.Random(0)
    example = next(e for e in iter(lambda: task.sample(rng), None) if sum(e.meta["derived"]) >= 2)
    rules = rule_lookups.prompt_rules(example.prompt)
    copies = rule_lookups.rule_copies(example.reasoning)
    assert len(copies) == sum(example.meta["derived"])
    for a, b, asked, fact, place in copies:
        assert example.reasoning[a - len(asked) - 2:b] == f"{asked}: {rules[asked]}." and place == "1st, behind"
        pilot = example.reasoning[:a].splitlines()[-1].split("? ")[0].split()[2]  # `3. Is Kim cleared? ...`
        assert fact.startswith(f"{pilot} ") and ":" not in fact


@pytest.mark.parametrize("form", ["sentence", "keyed"])
def test_a_drill_line_s_rule_copy_in_either_form(form):
    rng = random.Random(1)
    example = get_task("rules", rules=form).sample(rng)
    rules = rule_lookups.prompt_rules(example.prompt)
    assert rules == rule_lookups.prompt_rules(get_task("rules").sample(random.Random(1)).prompt)  # same world
    copies = rule_lookups.rule_copies(example.answer)
    assert len(copies) == len(example.answer.splitlines())
    for a, b, asked, _, _ in copies:
        assert example.answer[a:b] == (f"{rules[asked]} is {asked}." if form == "sentence" else f"{rules[asked]}.")


def test_error_sources():
    rules = {"cleared": "licensed and rested", "approved": "insured"}
    source = rule_lookups.error_source
    assert source("and", "approved", rules, "Kim is insured") == "count"
    assert source("licensed", "approved", rules, "Kim is insured") == "other rule"
    assert source("licensed", "approved", rules, "Kim is licensed, insured and rested") == "other rule and fact line"
    assert source("trained", "cleared", rules, "Kim is trained") == "fact line"
    assert source("Kim", "cleared", rules, "Kim is trained") == "fact line"
    assert source("certified", "cleared", rules, "Kim is trained") == "neither"


def test_rows_count_every_rule_copy_once(model, tokenizer):
    """On a tiny random model: each group's total is the number of copied rules, split by the
    number of rules in the prompt."""
    joint = eval_examples(3, seed=0, tasks=[get_task("joint")])
    drill = eval_examples(3, seed=0, tasks=[get_task("rules")])
    with torch.inference_mode():
        rows = rule_lookups.lookup_rows(model, tokenizer, {"joint": joint, "drill": drill})
    assert [row.split(":")[0] for row in rows[::3]] == ["joint", "drill"]
    for row, places, examples in zip(rows[::3], rows[1::3], (joint, drill)):
        n = sum(len(rule_lookups.rule_copies(e.reasoning or e.answer)) for e in examples)
        assert row.split(": ")[1].startswith(f"{row.split(': ')[1].split('/')[0]}/{n} ")
        by_rules = row.split("; ")[1].rstrip(")").split(", ")
        assert sum(int(part.split("/")[1]) for part in by_rules) == n
        assert sum(int(part.split("/")[1]) for part in places.split(": ")[1].split("; ")) == n


def test_a_space_before_another_condition_is_a_wrong_count():
    assert rule_lookups.error_source("", "cleared", {"cleared": "rested"}, "Kim is rested") == "count"
