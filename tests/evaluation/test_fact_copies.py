"""`benchmarks/fact_copies.py` finds each fact-line copy, where its first wrong token is, and whether
another pilot's line writes that token after the same words."""

import pytest
import torch

from clover.data import eval_examples, get_task
from benchmark_script import load_benchmark

fact_copies = load_benchmark("fact_copies")
PROMPT = "Facts (nothing else is true):\nFay is licensed.\nMia is licensed and trained.\nLeo has none of these.\n"


@pytest.mark.parametrize("line_rules, facts", [("sentence", "stated"), ("keyed_before_fact", "stated"),
                                               ("sentence", "counted")])
def test_copies_span_each_fact_line_after_its_name(line_rules, facts):
    example = eval_examples(4, seed=0, tasks=[get_task("joint", line_rules=line_rules, facts=facts)])[0]
    lines = fact_copies.prompt_lines(example.prompt)
    found = fact_copies.copies(example.reasoning)
    assert len(found) == len(example.reasoning.splitlines())
    for pilot, start, end in found:
        assert example.reasoning[start - len(pilot):start] == pilot and example.reasoning[start:end] == lines[pilot]


def test_a_wrong_token_is_told_apart_by_the_line_that_writes_it():
    lines = fact_copies.prompt_lines(PROMPT)
    assert lines == {"Fay": " is licensed.", "Mia": " is licensed and trained.", "Leo": " has none of these."}
    assert fact_copies.from_another_line(" is licensed", ".", "Mia", lines)  # Fay's line ends there
    assert not fact_copies.from_another_line(" is licensed", ",", "Mia", lines)
    assert fact_copies.from_another_line(" is licensed and", " trained", "Fay", lines)  # Mia's goes on
    assert not fact_copies.from_another_line(" is licensed and", " trained", "Mia", lines)  # only its own
    assert fact_copies.from_another_line(" ", "has", "Mia", lines)
    assert [fact_copies.place(k, t) for k, t in enumerate([" ", "is", " ", "licensed", " ", "and", "."])] == [
        "verb", "verb", "separator", "word", "separator", "separator", "separator"]
    counted = [" ", "2", " ", "licensed", " ", "and", "."]  # `Mia 2 licensed and trained.`
    assert [fact_copies.place(k, t) for k, t in enumerate(counted)][:4] == ["verb", "count", "separator", "word"]
    assert fact_copies.place(1, "is", "1") == "count" and fact_copies.place(1, "is", "has") == "verb"
    assert fact_copies.prompt_lines(PROMPT.replace(" is licensed", " 1 licensed").replace(" has none of these", " 0")
                                    ) == {"Fay": " 1 licensed.", "Mia": " 1 licensed and trained.", "Leo": " 0."}


def test_table_counts_every_copy_once_per_mode(model, tokenizer):
    examples = eval_examples(3, seed=0, tasks=[get_task("joint")])
    with torch.inference_mode():
        rows = fact_copies.table(model, tokenizer, examples)
    n = sum(len(fact_copies.copies(e.reasoning)) for e in examples)
    for row in rows[1:]:
        copies, right, verb, count, separator, word, another = map(int, row.split()[1:])
        assert copies == n and right + verb + count + separator + word == n and another <= n - right
