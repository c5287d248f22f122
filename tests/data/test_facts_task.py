"""The `facts` drill: joint's prompts with confusable fact lines, each answer line ending with the pilot's."""

from __future__ import annotations

import re

import pytest

from clover.data.tasks import EVAL_TASKS, get_task
from clover.data.tasks.facts import confusable


def _facts(prompt: str) -> dict[str, str]:
    block = prompt.split("Facts (nothing else is true):\n")[1].split("\nQuestions:")[0]
    return {line.split()[0]: line for line in block.splitlines()}


def test_each_line_is_the_question_and_the_pilots_fact_line():
    task = get_task("facts")
    pilots = set()
    for seed in range(200):
        example = task.generate(seed, "train")
        facts = _facts(example.prompt)
        questions = example.prompt.split("Questions:\n")[1].splitlines()[:-1]
        lines = example.answer.splitlines()
        assert len(lines) == len(questions) >= 2 and 2 <= len(facts) <= 3
        pilots.add(len(facts))
        assert confusable([line.split(" ", 1)[1] for line in facts.values()])
        for k, (line, question) in enumerate(zip(lines, questions), 1):
            pilot = re.fullmatch(rf"{k}\. Is (\w+) \w+\?", question)[1]
            assert line == f"{question} {facts[pilot]}"
        assert task.score(example, example.answer)["correct"] and not task.score(example, lines[0])["correct"]
    assert pilots == {2, 3}


def test_confusable_lines_share_a_prefix_and_then_differ():
    assert confusable(["is licensed.", "is licensed and trained."])
    assert confusable(["is rested.", "has none of these.", "is rested, insured and trained."])
    assert not confusable(["is licensed.", "is rested."])
    assert not confusable(["has none of these.", "has none of these."])  # alike: nothing to tell apart


def test_the_drill_is_curriculum_only_and_refuses_bad_counts():
    assert "facts" not in EVAL_TASKS
    with pytest.raises(ValueError, match="need 1 <= min_questions <= max_questions, got 3..2"):
        get_task("facts", min_questions=3, max_questions=2)
