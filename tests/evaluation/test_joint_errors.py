"""`benchmarks/joint_errors.py` names the first part of a `joint` derivation that went wrong."""

import random
import re

import pytest
import torch

from clover.data import eval_examples, get_task
from clover.data.tasks.joint import DERIVED, JointTask
from benchmark_script import load_benchmark

joint_errors = load_benchmark("joint_errors")
FLIP = {"yes": "no", "no": "yes", "+": "-", "-": "+"}
# `checks`, the roster's lookups, keyed rules, keyed rules and fact lines, keyed line rules before the facts
LAYOUTS = ["", "listed", "paired", "signed", "signed_all", "roster", "keyed", "keyed lines", "keyed first",
           "keyed before fact"]
# `... rested. cleared: licensed and rested. no`, or right after the question
KEYED_RULE = re.compile(rf"[.?] ({'|'.join(DERIVED)}): ")


def _options(layout: str) -> dict:
    if layout in ("keyed first", "keyed before fact"):
        return {"line_rules": layout.replace(" ", "_")}
    if layout.startswith("keyed"):
        return {"rules": "keyed"} | ({"facts": "keyed"} if layout == "keyed lines" else {})
    return {"facts": "roster"} if layout == "roster" else {"checks": layout}


def _has_rule(line: str) -> bool:
    """Whether a derivation line copies a rule (its question asks a derived property), in either form."""
    return "Anyone who is" in line or bool(KEYED_RULE.search(line))


def _example(**options):
    """A joint example whose last question is about a derived property (it has a rule line)."""
    task, rng = JointTask(min_questions=3, max_questions=4, **options), random.Random(0)
    while True:
        example = task.sample(rng)
        if example.meta["derived"][-1]:
            return example


def _output(lines, answer):
    return "<think>\n" + "\n".join(lines) + "\n</think>\n\n" + answer


@pytest.mark.parametrize("checks", LAYOUTS)
def test_each_part_of_a_derivation_line_is_told_apart(checks):
    example = _example(**_options(checks))
    lines = example.reasoning.splitlines()
    last = lines[-1]
    verdict = last.rsplit(" ", 1)[1]
    flipped = {"yes": "no", "no": "yes"}[verdict]
    question, fact, rules, written, _ = joint_errors.line_parts(last)
    assert _has_rule(last) and rules.endswith(".") and verdict in ("yes", "no")
    assert bool(written) == bool(checks and not checks.startswith("keyed")) and ("Anyone" not in written)
    wrong = {
        "question": last.replace(question, question + "x", 1),
        "fact": last.replace(fact, fact + " and tired", 1),
        "rule": last.replace(rules.split(". ")[0], "x" + rules.split(". ")[0], 1),  # its first rule (or keyed copy)
        "yes/no": last[: -len(verdict)] + flipped,
        "format": "3 Is",
    }
    if written:  # the first check's word flipped
        word = joint_errors.CHECK_WORD.search(written)
        wrong["checks"] = last.replace(written, written[:word.start()] + FLIP[word[0]]
                                       + written[word.end():], 1)
    for kind, line in wrong.items():
        got = joint_errors.first_error(_output(lines[:-1] + [line], example.answer), example.reasoning)
        assert got == (kind, line, last), kind
    assert joint_errors.first_error(_output(lines, "1:yes"), example.reasoning) == ("answer", "1:yes", "")
    assert joint_errors.first_error(_output(lines[:-1], example.answer), example.reasoning)[0] == "format"


@pytest.mark.parametrize("checks", LAYOUTS)
def test_part_spans_cover_each_part_of_a_line_in_order(checks):
    """The teacher-forced table labels a line's characters by part: the spans are the parts' texts,
    in line order (a keyed-first line's rule in two, around the fact line), and a base property's line
    has no rule part."""
    example = _example(**_options(checks))
    for line in example.reasoning.splitlines():
        spans = joint_errors.part_spans(line)
        parts = {p: text for p, text in zip(joint_errors.PARTS, joint_errors.line_parts(line)) if text}
        assert {p: " ".join(line[a:b] for q, a, b in spans if q == p) for p, _, _ in spans} == parts
        assert all(b1 <= a2 for (_, _, b1), (_, a2, _) in zip(spans, spans[1:]))
        order = [p for p, _, _ in spans]
        keyed_before = {"keyed first": ["question", "rule", "fact", "rule", "yes/no"],
                        "keyed before fact": ["question", "rule", "fact", "yes/no"]}
        assert order == (keyed_before[checks] if checks in keyed_before and "rule" in order
                         else [p for p in joint_errors.PARTS if p in parts])
        derived = _has_rule(line)
        assert ("rule" in [p for p, _, _ in spans]) == derived
        assert joint_errors.verdict_kind(line) == f"{'derived' if derived else 'base'} {line.rsplit(' ', 1)[1]}"


@pytest.mark.parametrize("checks", LAYOUTS)
def test_teacher_forced_table_counts_every_line_once_per_part(model, tokenizer, checks):
    """On a tiny random model: each part's line count is the number of derivation lines that have it
    (the rule only on derived lines), the verdict kinds add up to the yes/no row, the kinds split
    by fact-line length count the lines that state 1 or 2 properties, and (with `checks`) the
    check words add up to the yes/no words written in the checks."""
    examples = eval_examples(2, seed=0, tasks=[get_task("joint", **_options(checks))])
    lines = [line for e in examples for line in e.reasoning.splitlines()]
    with torch.inference_mode():
        rows = joint_errors.teacher_forced_table(model, tokenizer, examples)
    totals = {row.rsplit(None, 5)[0]: int(row.split()[-2].split("/")[1]) for row in rows[1:]}
    alone = {row.rsplit(None, 5)[0]: row.split()[-1] for row in rows[1:]}  # the yes/no words masked alone
    assert {part for part, value in alone.items() if value != "-"} == {
        part for part in totals if part == "yes/no" or part.startswith(("check ", "base ", "derived "))}
    assert totals["question"] == totals["yes/no"] == len(lines)
    assert totals.get("rule", 0) == sum(map(_has_rule, lines))
    kinds = [part for part in totals if part.startswith(("base", "derived"))]
    assert sum(totals[k] for k in kinds if "stated" not in k) == len(lines)
    for n in (1, 2):
        assert sum(totals[k] for k in kinds if k.endswith(f"{n} stated")) == \
            sum(joint_errors.stated(line) == n for line in lines)
    written = [joint_errors.line_parts(line)[3] for line in lines]
    assert totals.get("checks", 0) == sum(map(bool, written))
    assert (totals.get("checks", 0) > 0) == bool(checks and not checks.startswith("keyed"))
    assert sum(totals.get(f"check {w}", 0) for w in ("yes", "no")) == sum(
        len(joint_errors.CHECK_WORD.findall(text)) for text in written)


def test_stated_counts_the_properties_of_a_fact_line():
    line = "2. Is Kim cleared? Kim is licensed, insured and rested. Anyone who is licensed is cleared. yes"
    assert joint_errors.stated(line) == 3
    assert joint_errors.stated("1. Is Kim insured? Kim is rested. no") == 1
    assert joint_errors.stated("1. Is Kim insured? Kim has none of these. no") == 0
    roster_line = "1. Is Kim insured? Kim: rested=yes, insured=no, licensed=yes. insured=no. no"
    assert joint_errors.stated(roster_line) == 2
    assert joint_errors.stated("1. Is Kim cleared? Kim: licensed and rested. cleared: rested. yes") == 2
    assert joint_errors.stated("1. Is Kim insured? Kim: none. no") == 0
    assert joint_errors.stated("1. Is Kim insured? Kim 2 licensed and rested. no") == 2  # counted
    assert joint_errors.stated("1. Is Kim insured? Kim 0. no") == 0


@pytest.mark.parametrize("keyed", [False, True])
def test_a_wrong_fact_line_is_told_apart_by_the_words_it_changes(keyed):
    """Another pilot's line, only the answer's words (the asked property, or the rule's conditions)
    added or dropped, or any other property."""
    rule = "cleared: licensed and rested." if keyed else "Anyone who is licensed and rested is cleared."
    want = f"2. Is Kim cleared? Kim is rested and insured. {rule} no"
    assert joint_errors.answer_words(want) == {"licensed", "rested"}
    for fact, kind in (("Ivy is rested and insured", "pilot"), ("Kim is licensed, rested and insured", "answer"),
                       ("Kim is insured", "answer"), ("Kim has none of these", "other"),
                       ("Kim is rested", "other"), ("Kim is trained, rested and insured", "other")):
        assert joint_errors.fact_error(want.replace("Kim is rested and insured", fact), want) == kind, fact
    base = "1. Is Kim insured? Kim is licensed, insured and rested. yes"
    assert joint_errors.answer_words(base) == {"insured"}
    assert joint_errors.fact_error("1. Is Kim insured? Kim is licensed and rested. no", base) == "answer"
    assert joint_errors.fact_words("Kim: none") == ("Kim", set())
