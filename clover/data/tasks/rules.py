"""``rules``: find the rule behind each asked property (a curriculum drill, not an evaluation task).

A ``joint`` derivation line copies the rule that decides a derived property: ``2. Is Kim cleared?
Kim is rested. Anyone who is licensed and rested is cleared. no``. The rule is found by its last
word, so the copy looks backwards from the property to the conditions written before it. This is
the step of joint the embedded model misses most: under teacher forcing it copies the other rule's
conditions, or the wrong number of them, on about a third of the lines
(``benchmarks/rule_lookups.py``).

The drill keeps joint's prompt (rules, facts, numbered questions; its own instruction) and its
lines, but asks derived properties only, under 2 to ``max_rules`` rules (joint asks under 2 or 3)
whose conditions all differ, and stops each line after the rule, with no verdict: ``1. Is Kim
cleared? Kim is rested. Anyone who is licensed and rested is cleared.``. Every answer line is one
rule lookup in the context a joint line gives it, with the fact line just written as its
distractor. With ``rules="keyed"`` the rules are written property first, in the prompt and in the
lines (``cleared: licensed and rested.``, joint's option of the same name), so that each lookup is
a forward copy from its key. Measured from the embedded model, neither form teaches the lookup
(BENCHMARKS.md, "A drill for joint's rule lookup"). ``curriculum = True`` keeps it out of
``EVAL_TASKS`` and of the default mixtures.
"""

from __future__ import annotations

import random
from typing import Any

from clover.data.tasks.base import Example, Task, check_count_range, clean_output
from clover.data.tasks.joint import (BASE, DERIVED, MAX_PEOPLE, RULE_FORMS, draw_facts, draw_rules, fact_line,
                                     render, rule_line)
from clover.data.tasks.vocab import FIRST_NAMES

INSTRUCTION = "Write the rule that decides each question."


class RuleLookupTask(Task):
    """Joint's prompts with derived questions only; each answer line ends with the rule behind it."""

    name = "rules"
    curriculum = True

    def __init__(self, max_rules: int = 4, min_questions: int = 2, max_questions: int = 4,
                 rules: str = "sentence"):
        if rules not in RULE_FORMS:
            raise ValueError(f"rules={rules!r} must be one of {RULE_FORMS}")
        if not 2 <= max_rules <= len(DERIVED):
            raise ValueError(f"max_rules must be 2..{len(DERIVED)}, got {max_rules}")
        check_count_range("questions", min_questions, max_questions)
        self.max_rules = max_rules
        self.min_questions, self.max_questions = min_questions, max_questions
        self.rules = rules

    def sample(self, rng: random.Random) -> Example:
        base = rng.sample(BASE, 3)
        rules = draw_rules(rng, base, self.max_rules, chain=False)
        while len({conditions for _, conditions in rules}) < len(rules):  # each lookup tells rules apart
            rules = draw_rules(rng, base, self.max_rules, chain=False)
        people = rng.sample(FIRST_NAMES, rng.randint(1, MAX_PEOPLE))
        facts = draw_facts(rng, people, base)
        every = [(i, j) for i in range(len(people)) for j in range(len(rules))]
        n_q = min(rng.randint(self.min_questions, self.max_questions), len(every))
        asked = [(people[i], rules[j]) for i, j in sorted(rng.sample(every, n_q))]  # (pilot, rule)
        questions = [(pilot, derived) for pilot, (derived, _) in asked]
        prompt = render(rules, people, facts, base, questions, "stated", self.rules, INSTRUCTION)
        answer = "\n".join(f"{k}. Is {pilot} {rule[0]}? {fact_line(pilot, facts[pilot], base, 'stated')} "
                           f"{rule_line(rule, self.rules)}" for k, (pilot, rule) in enumerate(asked, 1))
        return Example(prompt, answer, self.name, {})

    def score(self, example: Example, output_text: str) -> dict[str, Any]:
        return {"correct": clean_output(output_text) == example.answer}
