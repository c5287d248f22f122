"""`benchmarks/copy_sources.py` finds the sites where another fact line (or rule) goes on differently
after the words a copy has written, and removes one part of the model at a time."""

import pytest
import torch

from clover.data import eval_examples, get_task
from clover.evaluation.field_loss import teacher_forced
from benchmark_script import load_benchmark
from tiny import random_ids, tiny_model

copy_sources = load_benchmark("copy_sources")


def test_rival_sites_are_where_another_line_parts_after_the_same_tokens():
    copy = [1, 2, 3, 4, 5]  # ` is licensed and trained.` as ids: verb 1, 2, then the list
    assert copy_sources.rival_sites(copy, [[1, 2, 3, 9], [1, 2, 8], [6, 7]]) == [(2, 8), (3, 9)]
    assert copy_sources.rival_sites(copy, [[1, 2, 3, 4, 5, 6]]) == []  # the same words: no rival
    assert copy_sources.rival_sites(copy, [[1, 7, 3, 9]]) == []  # parted before: the words differ


@pytest.mark.parametrize("lines", ["fact", "rule"])
def test_example_sites_follow_another_line_of_the_prompt(model, tokenizer, lines):
    texts = copy_sources.prompt_lines if lines == "fact" else copy_sources.prompt_rules
    found = 0
    for example in eval_examples(16, seed=0, tasks=[get_task("joint")]):
        with torch.inference_mode():
            forced = teacher_forced(model, tokenizer, example)
        others = [tokenizer(text, add_special_tokens=False).input_ids for text in texts(example.prompt).values()]
        for site in copy_sources.example_sites(tokenizer, forced, example, lines):
            found += 1
            assert forced.targets[site.k] == site.right != site.rival
            written = forced.targets[:site.k].tolist()
            assert any(written[len(written) - j:] == other[:j] and other[j] == site.rival
                       for other in others for j in range(2, len(other)))
    assert found


def test_rule_copies_are_the_prompt_rules_of_the_asked_property():
    found = 0
    for example in eval_examples(16, seed=0, tasks=[get_task("joint")]):
        rules = copy_sources.prompt_rules(example.prompt)
        assert rules and all(rule.startswith("Anyone who is ") for rule in rules.values())
        copied = copy_sources.rule_copies(example.reasoning)
        asked = [line.split("?")[0].rsplit(" ", 1)[-1] for line in example.reasoning.split("\n") if " Anyone " in line]
        assert [key for key, _, _ in copied] == asked
        assert [example.reasoning[start:end] for _, start, end in copied] == [rules[key] for key in asked]
        found += len(copied)
    assert found


def test_removing_a_part_changes_the_logits_until_the_context_closes():
    model = tiny_model()
    ids = random_ids(1, 12)
    parts = copy_sources.parts(model)
    assert len(parts) == 2 * 4 + 2 * 4 + 4  # 4 GDN value heads, 4 attention heads, 4 MoE blocks
    with torch.inference_mode():
        base = model(ids).logits
        for part in parts:
            with copy_sources.removed(part):
                assert not torch.allclose(model(ids).logits, base), part.name
            assert torch.equal(model(ids).logits, base), part.name


def test_effects_split_wrong_and_right_sites():
    e = copy_sources.effects([-1.0, -2.0, 3.0, 0.5], [0.5, -1.0, 1.0, -0.5])
    assert e == {"wrong": 1.25, "mended": 1, "right": -1.5, "broken": 1}


def test_table_has_a_row_per_part_and_counts_within_its_sites(model, tokenizer):
    examples = eval_examples(6, seed=0, tasks=[get_task("joint")])
    with torch.inference_mode():
        rows = copy_sources.table(model, tokenizer, examples)
    sites, wrong = int(rows[0].split()[0]), int(rows[0].split(", ")[1].split()[0])
    assert sites and len(rows) == 3 + len(copy_sources.parts(model))
    for row in rows[3:]:
        mended, broken = int(row.split()[-3]), int(row.split()[-1])
        assert 0 <= mended <= wrong and 0 <= broken <= sites - wrong
    with torch.inference_mode():
        assert copy_sources.table(model, tokenizer, examples, removals=False) == rows[:3]  # the sites alone
