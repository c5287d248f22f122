"""``facts``: copy each asked pilot's fact line (a curriculum drill, not an evaluation task).

A ``joint`` derivation line copies its pilot's fact line from the prompt by the pilot's name:
``2. Is Mia cleared? Mia is licensed and trained. ...``. When two pilots' lines share a word, the
copy that goes by the word just written can follow it into the other line (``Mia is licensed`` +
``.`` from ``Fay is licensed.``): most of the embedded model's wrong fact lines do
(``benchmarks/fact_copies.py``), and its residual stream does not hold whose line a word is in past
the line's first property (``benchmarks/owner_probe.py``).

The drill keeps joint's prompt (rules, facts, numbered questions; its own instruction) and its
lines, but every prompt has two or three pilots, redrawn until two of their lines share a prefix
and then differ (so that only the line's pilot tells which to follow), and each answer line stops
after the fact line: ``1. Is Mia cleared? Mia is licensed and trained.``. Measured from the
embedded model, the drill is learned slowly and joint's fact lines do not gain (BENCHMARKS.md, "The
fact lines follow a shared word"). ``curriculum = True`` keeps it out of ``EVAL_TASKS`` and of the
default mixtures.
"""

from __future__ import annotations

import random
import re
from itertools import combinations
from typing import Any

from clover.data.tasks.base import Example, Task, check_count_range, clean_output
from clover.data.tasks.joint import BASE, MAX_PEOPLE, draw_facts, draw_rules, fact_line, render
from clover.data.tasks.vocab import FIRST_NAMES

INSTRUCTION = "Write the fact line behind each question."


def confusable(lines: list[str]) -> bool:
    """Whether two fact lines (the text after the pilot) share a first word and then differ."""
    words = [re.findall(r"\w+", line) for line in lines]
    return any(a != b and a[:2] == b[:2] for a, b in combinations(words, 2))


class FactLookupTask(Task):
    """Joint's prompts with confusable fact lines; each answer line ends with the pilot's fact line."""

    name = "facts"
    curriculum = True

    def __init__(self, min_questions: int = 2, max_questions: int = 4):
        check_count_range("questions", min_questions, max_questions)
        self.min_questions, self.max_questions = min_questions, max_questions

    def sample(self, rng: random.Random) -> Example:
        base = rng.sample(BASE, 3)
        rules = draw_rules(rng, base, 2, chain=False)
        props = base + [derived for derived, _ in rules]
        people = rng.sample(FIRST_NAMES, rng.randint(2, MAX_PEOPLE))
        while True:
            facts = draw_facts(rng, people, base)
            lines = [fact_line(p, facts[p], base, "stated")[len(p) + 1:] for p in people]
            if confusable(lines):
                break
        every = [(i, j) for i in range(len(people)) for j in range(len(props))]
        n_q = rng.randint(self.min_questions, self.max_questions)
        questions = [(people[i], props[j]) for i, j in sorted(rng.sample(every, n_q))]
        prompt = render(rules, people, facts, base, questions, "stated", "sentence", INSTRUCTION)
        answer = "\n".join(f"{k}. Is {pilot} {prop}? {fact_line(pilot, facts[pilot], base, 'stated')}"
                           for k, (pilot, prop) in enumerate(questions, 1))
        return Example(prompt, answer, self.name, {})

    def score(self, example: Example, output_text: str) -> dict[str, Any]:
        return {"correct": clean_output(output_text) == example.answer}
