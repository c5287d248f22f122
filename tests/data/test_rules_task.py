"""The `rules` drill: joint's prompts, derived questions only, each line ending with its rule."""

from __future__ import annotations

import random
import re

import pytest

from clover.data.tasks import EVAL_TASKS, get_task
from clover.data.tasks.joint import DERIVED, JointTask

_RULE = re.compile(r"Anyone who is (.+) is (\w+)\.")


def _prompt_parts(prompt: str) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """The prompt's rule lines by derived property, fact lines by pilot, and question lines."""
    rules = {m[2]: m[0] for m in _RULE.finditer(prompt.split("Facts")[0])}
    facts_block = prompt.split("Facts (nothing else is true):\n")[1].split("\nQuestions:")[0]
    facts = {line.split()[0]: line for line in facts_block.splitlines()}
    questions = prompt.split("Questions:\n")[1].splitlines()[:-1]
    return rules, facts, questions


def test_each_line_is_the_question_the_pilots_fact_line_and_the_rule_behind_it():
    task = get_task("rules")
    counts = set()
    for seed in range(200):
        example = task.generate(seed, "train")
        rules, facts, questions = _prompt_parts(example.prompt)
        lines = example.answer.splitlines()
        assert len(lines) == len(questions) and 2 <= len(rules) <= 4
        counts.add(len(rules))
        conditions = [line.split(" is ")[1] for line in rules.values()]
        assert len(set(conditions)) == len(conditions)  # no two rules alike: each lookup decides
        for k, (line, question) in enumerate(zip(lines, questions), 1):
            pilot, prop = re.fullmatch(rf"{k}\. Is (\w+) (\w+)\?", question).groups()
            assert prop in DERIVED
            assert line == f"{question} {facts[pilot]} {rules[prop]}"
        assert task.score(example, example.answer)["correct"]
    assert counts == {2, 3, 4}


def test_a_line_is_a_joint_derivation_line_without_its_verdict():
    drill, joint = get_task("rules"), JointTask(facts="stated")  # the drill writes stated fact lines
    drill_line = drill.generate(3, "train").answer.splitlines()[0]
    joint_lines = [line for seed in range(50) for line in joint.generate(seed, "train").reasoning.splitlines()
                   if "Anyone" in line]
    shape = re.compile(r"\d\. Is \w+ \w+\? \w+ (is [\w ,]+|has none of these)\. Anyone who is [\w ]+ is \w+\.")
    assert shape.fullmatch(drill_line)
    assert joint_lines and all(shape.fullmatch(line.rsplit(" ", 1)[0]) for line in joint_lines)


def test_another_rule_is_wrong():
    example = get_task("rules").generate(0, "train")
    rules, _, _ = _prompt_parts(example.prompt)
    line = example.answer.splitlines()[0]
    asked = next(rule for rule in rules.values() if line.endswith(rule))
    other = next(rule for rule in rules.values() if rule != asked)
    wrong = example.answer.replace(asked, other, 1)
    assert not get_task("rules").score(example, wrong)["correct"]


def test_it_is_a_drill_not_an_evaluation_task():
    assert "rules" not in EVAL_TASKS


def test_keyed_rules_draw_the_same_world_with_the_property_first():
    sentence, keyed = get_task("rules"), get_task("rules", rules="keyed")
    for seed in range(20):
        a, b = sentence.sample(random.Random(seed)), keyed.sample(random.Random(seed))  # one stream, no split
        rules = [(m[2], m[1]) for m in _RULE.finditer(a.prompt)]
        assert b.prompt.split("Facts")[0] == "Rules:\n" + "".join(f"{d}: {c}.\n" for d, c in rules)
        for line_a, line_b in zip(a.answer.splitlines(), b.answer.splitlines()):
            derived, conditions = _RULE.search(line_a)[2], _RULE.search(line_a)[1]
            assert line_b == line_a.replace(f"Anyone who is {conditions} is {derived}.", f"{derived}: {conditions}.")


@pytest.mark.parametrize("options", [{"max_rules": 1}, {"max_rules": 6}, {"min_questions": 0},
                                     {"min_questions": 3, "max_questions": 2}, {"rules": "listed"}])
def test_bad_options_are_refused(options):
    with pytest.raises(ValueError, match=next(iter(options))[:3]):
        get_task("rules", **options)
