"""Task generators: deterministic per (seed, split), disjoint splits, sane content."""

from __future__ import annotations

import json
import random
import re

import pytest

from clover.data import eval_examples
from clover.data.tasks import TASKS, Example, get_task, split_of
from clover.data.tasks.airspace import AirspaceTask

NAMES = sorted(TASKS)
_RADIUS = re.compile(r"(\d+(?:\.\d)?) ?(km|kilometres|metres|m|NM)\b")


def _fact_lines(prompt: str) -> list[str]:
    """A joint prompt's closed-world fact lines, one per pilot (stated or counted)."""
    return re.split(r"Facts \(.*nothing else is true\):\n", prompt)[1].split("\nQuestions:")[0].splitlines()


def _listed(sentence: str) -> list[str]:
    """The properties a closed-world fact line states, in order: `Kim is a, b and c.` or counted `Kim 3
    a, b and c.` -> [a, b, c]; `Kim has none of these.` or `Kim 0.` -> []."""
    listed = re.fullmatch(r"\w+ (?:is|[1-3]) (.+?)\.?", sentence)
    return listed[1].replace(" and ", ", ").split(", ") if listed else []


def _stated(sentence: str) -> set[str]:
    """`_listed` as a set."""
    return set(_listed(sentence))


def _radius_km(text: str) -> float:
    """Independent reading of the (single) radius phrase in ``text``, in km to 0.1."""
    (value, unit), = _RADIUS.findall(text)
    factor = {"km": 1.0, "kilometres": 1.0, "m": 0.001, "metres": 0.001, "NM": 1.852}[unit]
    return int(float(value) * factor * 10 + 0.5 + 1e-9) / 10
CHAT_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|mask|>", "<think>")


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_example(name):
    a, b = get_task(name), get_task(name)
    for seed in range(20):
        assert a.generate(seed, "train") == b.generate(seed, "train")
        assert a.generate(seed, "eval") == b.generate(seed, "eval")


@pytest.mark.parametrize("name", NAMES)
def test_different_seeds_vary(name):
    task = get_task(name)
    prompts = {task.generate(seed, "train").prompt for seed in range(50)}
    assert len(prompts) >= 45


@pytest.mark.parametrize("name", NAMES)
def test_splits_are_disjoint(name):
    task = get_task(name)
    train = {task.generate(seed, "train").prompt for seed in range(2000)}
    evals = {task.generate(seed, "eval").prompt for seed in range(200)}
    assert train.isdisjoint(evals)
    assert all(split_of(p) == "train" for p in train)
    assert all(split_of(p) == "eval" for p in evals)
    assert len(evals) >= 190


def test_unknown_split_and_task():
    with pytest.raises(ValueError):
        get_task("airspace").generate(0, "test")
    with pytest.raises(KeyError):
        get_task("nope")


@pytest.mark.parametrize("name", NAMES)
def test_examples_are_plain_text(name):
    task = get_task(name)
    for seed in range(30):
        ex = task.generate(seed, "train")
        assert isinstance(ex, Example) and ex.task == name
        assert ex.prompt and ex.answer and ex.answer == ex.answer.strip()
        assert not any(t in ex.prompt or t in ex.answer for t in CHAT_TOKENS)
        assert task.score(ex, ex.answer)["correct"]


def test_airspace_answer_shape():
    task = get_task("airspace", max_notices=20, wordings=5, time_forms=4)
    for seed in range(100):
        ex = task.generate(seed, "train")
        zones = json.loads(ex.answer)
        assert ex.answer == json.dumps(zones, separators=(",", ":"), ensure_ascii=False)
        notice_order = [line.split()[1].rstrip(":") for line in ex.prompt.splitlines()[1:]]
        first_seen = sorted(zones, key=lambda z: notice_order.index(z["id"]))
        assert zones == first_seen  # the order the notices were issued in
        for z in zones:
            assert list(z) == ["id", "location", "radius_km", "start", "end"]
            assert z["radius_km"] == round(z["radius_km"], 1) and 0 < z["radius_km"] <= 8.0
            assert z["start"] < z["end"] and len(z["start"]) == len(z["end"]) == 5
        n_lines = len(ex.prompt.splitlines()) - 1
        assert 1 <= n_lines <= 20 and n_lines == ex.meta["n_notices"]


def test_airspace_notice_count_options():
    assert max(AirspaceTask().generate(s, "train").meta["n_notices"] for s in range(200)) == 4
    big = AirspaceTask(min_notices=20, max_notices=20)
    assert big.generate(0, "train").meta["n_notices"] == 20
    with pytest.raises(ValueError):
        AirspaceTask(max_notices=21)


def test_airspace_cancel_and_amend_apply():
    task = get_task("airspace", min_notices=6, max_notices=6)
    seen_cancel = seen_amend = False
    for seed in range(200):
        ex = task.generate(seed, "train")
        ids = {z["id"] for z in ex.meta["zones"]}
        seen_ids = set()
        for line in ex.prompt.splitlines()[1:]:
            zone_id = line.split()[1].rstrip(":")
            if "CANCELLED" in line or "AMENDED" in line:  # a modifier follows its zone's notice
                assert zone_id in seen_ids
            seen_ids.add(zone_id)
            if "CANCELLED" in line:
                seen_cancel = True
                assert zone_id not in ids
            if "AMENDED: radius now" in line and zone_id in ids:
                seen_amend = True
                zone = next(z for z in ex.meta["zones"] if z["id"] == zone_id)
                assert zone["radius_km"] == _radius_km(line)
    assert seen_cancel and seen_amend


def test_airspace_modifiers_last():
    """With `modifiers_last=1` every modifier follows the last new zone; the option off draws nothing,
    so default prompts are those of every earlier seed; out of range is refused."""
    task = get_task("airspace", min_notices=6, max_notices=6, modifiers_last=1.0)
    moved = 0
    for seed in range(100):
        lines = task.generate(seed, "train").prompt.splitlines()[1:]
        is_modifier = ["CANCELLED" in line or "AMENDED" in line for line in lines]
        assert is_modifier == sorted(is_modifier)  # no new zone after a modifier
        moved += any(is_modifier)
    assert moved > 50
    # seed 3's third evaluation prompt, as BENCHMARKS.md's airspace section quotes it
    third = eval_examples(40, seed=3, tasks=[get_task("airspace")])[2].prompt.splitlines()
    assert third[1:] == ["NOTICE Z43: Temporary no-fly zone at South Port (6100 metres radius), 1315-1900.",
                         "NOTICE Z47: Temporary no-fly zone at Green Valley (5.5 km radius), 05:00 to 07:00.",
                         "NOTICE Z38: Temporary no-fly zone at Market Square (4900 m radius), 0800-1345.",
                         "NOTICE Z47 CANCELLED, zone released."]
    anywhere = [task.generate(s, "train").prompt for s in range(100)]
    assert anywhere != [get_task("airspace", min_notices=6, max_notices=6).generate(s, "train").prompt
                        for s in range(100)]
    with pytest.raises(ValueError, match="modifiers_last=1.5"):
        get_task("airspace", modifiers_last=1.5)


def test_airspace_nautical_miles_rounding():
    task = AirspaceTask(min_notices=1, max_notices=1, nautical_miles=True)
    checked = 0
    for seed in range(300):
        ex = task.generate(seed, "train")
        if " NM" in ex.prompt:
            assert ex.meta["zones"][0]["radius_km"] == _radius_km(ex.prompt)
            checked += 1
    assert checked > 20


def test_joint_answer_format():
    task = get_task("joint")
    counts = set()
    for seed in range(200):
        ex = task.generate(seed, "train")
        items = ex.answer.split()
        counts.add(len(items))
        assert [i.split(":")[0] for i in items] == [str(k) for k in range(1, len(items) + 1)]
        assert all(i.split(":")[1] in ("yes", "no") for i in items)
        assert f"{len(items)}. Is " in ex.prompt and f"{len(items) + 1}. Is " not in ex.prompt
    assert counts == set(range(2, 5))
    wide = get_task("joint", max_questions=8, max_rules=3, chain=True)
    assert {len(wide.generate(seed, "train").answer.split()) for seed in range(300)} == set(range(2, 9))


def test_joint_balanced_answers_do_not_follow_the_fact_line_length():
    """Drawn uniformly, a base property asked of a pilot with one stated property is mostly "no" and
    with two mostly "yes"; with `balanced` both are near even, and the option off draws nothing new."""
    def yes_share(task):
        counts = {1: [0, 0], 2: [0, 0]}  # stated properties -> [yes, questions] over base questions
        for seed in range(600):
            ex = task.generate(seed, "train")
            for line in ex.reasoning.splitlines():
                fact, verdict = line.split("? ")[1].split(". ")[0], line.rsplit(" ", 1)[1]
                size = len(_listed(fact))
                if "Anyone" not in line and size in counts:
                    counts[size][0] += verdict == "yes"
                    counts[size][1] += 1
        return {size: yes / n for size, (yes, n) in counts.items()}

    uniform, balanced = yes_share(get_task("joint")), yes_share(get_task("joint", balanced=True))
    assert uniform[1] < 0.4 and uniform[2] > 0.6
    assert 0.4 < balanced[1] < 0.6 and 0.4 < balanced[2] < 0.6
    ex = get_task("joint", balanced=True, max_questions=8).generate(0, "train")
    assert get_task("joint", balanced=True).score(ex, ex.answer)["correct"]
    first = eval_examples(40, seed=3, tasks=[get_task("joint", facts="stated")])[0]  # as drawn before the option
    assert first.answer == "1:no 2:no 3:yes 4:yes" and first.prompt.splitlines()[4:7] == [
        "Fay is trained.", "Kim is insured.", "Ivy is trained."]


def test_joint_without_derived_questions_asks_only_base_properties():
    """`ask_derived=False` keeps the rules in the prompt but asks only base properties, so every line
    is one check of the fact line (no rule copied) and scores as before; balanced, its answers are
    near even; 8 questions still fit (3 pilots of 3 base properties)."""
    task = get_task("joint", ask_derived=False, balanced=True, max_questions=8)
    verdicts = []
    for seed in range(200):
        ex = task.generate(seed, "train")
        assert "Rules:\nAnyone who is" in ex.prompt and not any(ex.meta["derived"])
        assert "Anyone" not in ex.reasoning and len(ex.reasoning.splitlines()) == len(ex.meta["answers"])
        assert task.score(ex, ex.answer)["correct"]
        verdicts += ex.meta["answers"]
    assert 0.4 < sum(verdicts) / len(verdicts) < 0.6
    assert any(get_task("joint").generate(seed, "train").meta["derived"].count(True) for seed in range(20))


def test_joint_min_people_puts_more_pilots_in_a_prompt():
    """`min_people` gives every prompt at least that many fact lines (pilots), still scored as before;
    an out-of-range value is refused with the limit named."""
    for n in (2, 3):
        task = get_task("joint", min_people=n, balanced=True)
        for seed in range(100):
            ex = task.generate(seed, "train")
            assert len(_fact_lines(ex.prompt)) >= n and task.score(ex, ex.answer)["correct"]
    assert min(len(_fact_lines(get_task("joint").generate(seed, "train").prompt)) for seed in range(100)) == 1
    with pytest.raises(ValueError, match="min_people must be 1..3, got 4"):
        get_task("joint", min_people=4)


def test_joint_hard_verdicts_redraws_until_the_fact_lines_length_misleads():
    """`hard_verdicts=1` gives every prompt a derived question whose answer its fact line's length does
    not give (yes from one stated property, no from two), still scored as before; at 0 the draws are
    the default's; a share outside 0..1 is refused with the range named."""
    def misleads(ex):
        return [d and a != (n >= 2) for d, a, n in zip(*(ex.meta[k] for k in ("derived", "answers", "stated")))]
    hard, plain = get_task("joint", hard_verdicts=1.0, balanced=True), get_task("joint", balanced=True)
    for seed in range(100):
        ex = hard.generate(seed, "train")
        assert any(misleads(ex)) and hard.score(ex, ex.answer)["correct"]
        facts = {line.split(" ", 1)[0]: _listed(line) for line in _fact_lines(ex.prompt)}
        questions = ex.prompt.split("Questions:\n")[1].splitlines()[:-1]
        assert ex.meta["stated"] == [len(facts[q.split()[2]]) for q in questions]
    assert not all(any(misleads(plain.generate(seed, "train"))) for seed in range(100))
    default = get_task("joint", hard_verdicts=0.0)
    assert all(default.generate(s, "eval").prompt == get_task("joint").generate(s, "eval").prompt for s in range(20))
    with pytest.raises(ValueError, match="hard_verdicts is a share of prompts, 0..1, got 1.5"):
        get_task("joint", hard_verdicts=1.5)
    with pytest.raises(ValueError, match="needs ask_derived=True, got hard_verdicts=0.5 with ask_derived=False"):
        get_task("joint", hard_verdicts=0.5, ask_derived=False)


@pytest.mark.parametrize("layout", ["listed", "paired", "signed", "signed_all"])
def test_joint_checks_write_each_condition_against_the_fact_line(layout):
    """With `checks`, each line checks the asked property (or the rule's conditions, in order) against
    the fact line's properties one by one, until found, stopping after a condition not found; the
    last check's word is the answer (`signed_all`: every condition against every property, and the
    answer is yes when each condition has a yes). The option changes nothing else: same prompts and
    answers, and the same lines with the checks taken out."""
    every = layout == "signed_all"
    plain, checked = get_task("joint", balanced=True), get_task("joint", balanced=True, checks=layout)
    seen = set()
    for seed in range(200):
        a, b = plain.generate(seed, "train"), checked.generate(seed, "train")
        assert (a.prompt, a.answer, a.meta) == (b.prompt, b.answer, b.meta)
        for line, with_checks in zip(a.reasoning.splitlines(), b.reasoning.splitlines()):
            head, verdict = line.rsplit(" ", 1)
            checks = with_checks[len(head) + 1: -len(verdict) - 1]
            assert with_checks == f"{head} {checks} {verdict}" if checks else with_checks == line
            fact = line.split("? ")[1].split(". ")[0]
            held = _listed(fact)
            rule = head.split("Anyone who is ")[-1].split(" is ")[0] if "Anyone" in head else None
            conditions = rule.replace(" and ", ", ").split(", ") if rule else [line.split(" ")[3][:-1]]
            if not held:
                assert checks == ""
                continue
            words = []
            for condition, sentence in zip(conditions, checks.split(". ")):
                if layout == "listed":
                    name, _, tried = sentence.rstrip(".").partition(": ")
                    pairs = [t.split(" ") for t in tried.split(", ")]
                else:
                    tried = sentence.rstrip(".").split(", ")
                    pairs = ([(t[:-1], {"+": "yes", "-": "no"}[t[-1]]) for t in tried] if layout.startswith("signed")
                             else [t.split(" ") for t in tried])
                    names = {p.split("=")[1] for p, _ in pairs}
                    assert len(names) == 1
                    name, pairs = names.pop(), [(p.split("=")[0], w) for p, w in pairs]
                assert name == condition and [h for h, _ in pairs] == held[:len(pairs)]
                assert [w for _, w in pairs] == ["yes" if h == condition else "no" for h, _ in pairs]
                assert len(pairs) == len(held) if every else (pairs[-1][1] == "yes" or len(pairs) == len(held))
                words.append("yes" if "yes" in [w for _, w in pairs] else "no")
            assert len(words) == len(checks.split(". "))
            if every:  # every condition checked; yes when each has a yes
                assert len(words) == len(conditions) and verdict == ("no" if "no" in words else "yes")
            else:  # stops after a condition not found
                assert words[-1] == verdict and "no" not in words[:-1]
            seen.add((len(words), verdict))
    assert {(1, "yes"), (1, "no"), (2, "yes"), (2, "no")} <= seen
    with pytest.raises(ValueError, match="chain=True"):
        get_task("joint", checks=layout, chain=True)
    with pytest.raises(ValueError, match="'sideways' must be one of"):
        get_task("joint", checks="sideways")


def test_joint_roster_lists_every_value_and_each_line_looks_up_its_conditions():
    """With `facts="roster"` the prompt lists each pilot's value of every base property in place of the
    closed-world sentences; each line copies the pilot's roster line, the rule(s), then each condition
    with its value in that line, and the answer is yes when every value is. The draws are the stated
    prompts' (from the same random stream): the same pilots, properties, questions and answers."""
    stated, roster = get_task("joint", balanced=True), get_task("joint", balanced=True, facts="roster")
    seen = set()
    for seed in range(200):
        a, b = stated.sample(random.Random(seed)), roster.sample(random.Random(seed))
        assert (a.answer, a.meta) == (b.answer, b.meta) and roster.score(b, b.answer)["correct"]
        sentences = _fact_lines(a.prompt)
        rows = b.prompt.split("Roster:\n")[1].split("\nQuestions:")[0].splitlines()
        assert len(rows) == len(sentences)
        table = {}
        for sentence, row in zip(sentences, rows):
            name, _, values = row.rstrip(".").partition(": ")
            table[name] = dict(value.split("=") for value in values.split(", "))
            held = _stated(sentence)
            assert sentence.startswith(f"{name} ")
            assert {p for p, v in table[name].items() if v == "yes"} == held
            assert len(table[name]) == 3 and set(table[name].values()) <= {"yes", "no"}
        for line, answer in zip(b.reasoning.splitlines(), b.answer.split()):
            head, verdict = line.rsplit(" ", 1)
            pilot, asked = line.split("? ")[0].split(" ")[2:4]
            row = ", ".join(f"{p}={v}" for p, v in table[pilot].items())
            assert line.split("? ")[1].startswith(f"{pilot}: {row}. ")
            rule = head.split("Anyone who is ")[1].split(" is ")[0] if "Anyone" in head else None
            conditions = rule.replace(" and ", ", ").split(", ") if rule else [asked]
            lookups = [value.split("=") for value in head.rsplit(". ", 1)[1].rstrip(".").split(", ")]
            assert [c for c, _ in lookups] == conditions and all(table[pilot][c] == v for c, v in lookups)
            assert verdict == ("yes" if all(v == "yes" for _, v in lookups) else "no") == answer.split(":")[1]
            seen.add((len(lookups), verdict))
    assert {(1, "yes"), (1, "no"), (2, "yes"), (2, "no")} <= seen
    with pytest.raises(ValueError, match="facts='table' must be one of"):
        get_task("joint", facts="table")
    for options in ({"chain": True}, {"checks": "paired"}):
        with pytest.raises(ValueError, match="needs chain=False and checks=''"):
            get_task("joint", facts="roster", **options)


def _named_value(text: str) -> list[str]:
    """`"rested=yes"` or `"rested+"` -> `["rested", "yes"]`."""
    if text[-1] in "+-":
        return [text[:-1], "yes" if text[-1] == "+" else "no"]
    return text.split("=")


@pytest.mark.parametrize("form", ["named", "marked"])
def test_joint_named_roster_names_the_pilot_at_each_value_and_lines_copy_no_fact_line(form):
    """With `facts="named"` each roster value is written after its pilot's name (`Kim licensed=no, Kim
    rested=yes, Kim registered=yes.`; `"marked"`: `Kim licensed-, Kim rested+, Kim registered+.`), and a
    line writes the question, the rule(s), then each condition looked up by pilot and property (`Kim
    licensed=no, Kim rested=yes.`), and the answer: yes when every value is. The draws are the stated
    prompts'."""
    stated, named = get_task("joint", balanced=True), get_task("joint", balanced=True, facts=form)
    seen = set()
    for seed in range(200):
        a, b = stated.sample(random.Random(seed)), named.sample(random.Random(seed))
        assert (a.answer, a.meta) == (b.answer, b.meta) and named.score(b, b.answer)["correct"]
        heading = {"named": "Roster:\n", "marked": "Roster (+ yes, - no):\n"}[form]
        rows = b.prompt.split(heading)[1].split("\nQuestions:")[0].splitlines()
        table = {}
        for sentence, row in zip(_fact_lines(a.prompt), rows, strict=True):
            pairs = [value.split(" ") for value in row.rstrip(".").split(", ")]
            (name,) = {pilot for pilot, _ in pairs}
            table[name] = dict(_named_value(value) for _, value in pairs)
            held = _stated(sentence)
            assert sentence.startswith(f"{name} ") and len(table[name]) == 3
            assert {p for p, v in table[name].items() if v == "yes"} == held
        for line, answer in zip(b.reasoning.splitlines(), b.answer.split(), strict=True):
            head, verdict = line.rsplit(" ", 1)
            question, rest = line.split("? ", 1)
            pilot, asked = question.split(" ")[2:4]
            rule = rest.split("Anyone who is ")[1].split(" is ")[0] if rest.startswith("Anyone") else None
            conditions = rule.replace(" and ", ", ").split(", ") if rule else [asked]
            lookups = [value.split(" ") for value in head.rsplit(". ", 1)[-1].split("? ")[-1].rstrip(".").split(", ")]
            assert {name for name, _ in lookups} == {pilot}
            lookups = [_named_value(value) for _, value in lookups]
            assert [c for c, _ in lookups] == conditions and all(table[pilot][c] == v for c, v in lookups)
            assert verdict == ("yes" if all(v == "yes" for _, v in lookups) else "no") == answer.split(":")[1]
            seen.add((len(lookups), verdict))
    assert {(1, "yes"), (1, "no"), (2, "yes"), (2, "no")} <= seen
    for options, message in (({"chain": True}, "needs chain=False and checks=''"),
                             ({"line_rules": "both"}, "line_rules='both'")):
        with pytest.raises(ValueError, match=message):
            get_task("joint", facts=form, **options)


@pytest.mark.parametrize("layout", ["listed", "paired"])
def test_airspace_checks_scan_the_later_notices_up_to_the_modifier(layout):
    """With `checks`, a zone's line lists the ids of the notices after its own, in feed order, up
    to its modifier (or to the end), then the status line of the plain format; nothing else changes."""
    plain, checked = get_task("airspace", min_notices=3), get_task("airspace", min_notices=3, checks=layout)
    seen = set()
    for seed in range(100):
        a, b = plain.generate(seed, "train"), checked.generate(seed, "train")
        assert (a.prompt, a.answer, a.meta) == (b.prompt, b.answer, b.meta)
        ids = [line.split()[1].rstrip(":") for line in a.prompt.splitlines()[1:]]
        for status, line in zip(a.reasoning.splitlines(), b.reasoning.splitlines()):
            zone = status.split()[0]
            later = ids[ids.index(zone) + 1:]
            scanned = later[:later.index(zone)] if zone in later else later
            pair = f"={zone}" if layout == "paired" else ""
            match = f"{zone}=" if layout == "paired" and zone in later else ""
            assert line == f"{zone}: " + "".join(f"{z}{pair} no, " for z in scanned) + match + status
            assert (zone in later) == (zone in a.meta["modified"])
            seen.add((bool(scanned), zone in later))
    assert seen == {(False, False), (False, True), (True, False), (True, True)}
    with pytest.raises(ValueError, match="reasoning=True"):
        get_task("airspace", checks=layout, reasoning=False)
    with pytest.raises(ValueError, match="'sideways' must be one of"):
        get_task("airspace", checks="sideways")
    with pytest.raises(ValueError, match="'signed' must be one of"):  # a joint layout only
        get_task("airspace", checks="signed")


def test_record_answer_mentions_every_field():
    ex = get_task("record").generate(3, "train")
    for value in ex.meta["fields"].values():
        assert value in ex.answer and f"={value}" in ex.prompt


def test_task_difficulty_options():
    fixed = get_task("airspace", min_notices=3, max_notices=3)
    lines = [line for s in range(40) for line in fixed.generate(s, "train").prompt.splitlines()[1:]]
    assert all("Temporary no-fly zone at" in line for line in lines if "AMENDED" not in line
               and "CANCELLED" not in line)
    varied = get_task("airspace", min_notices=3, max_notices=3, wordings=5, time_forms=4)
    assert any("UAV operations" in varied.generate(s, "train").prompt for s in range(40))
    with pytest.raises(ValueError, match="wordings=6"):
        get_task("airspace", wordings=6)
    schema = ["flight", "pilot", "drone", "site", "purpose", "start", "end", "altitude"]
    record = get_task("record").generate(0, "train").prompt.splitlines()[1]
    assert [kv.split("=")[0] for kv in record.split("; ")] == schema
    shuffled = {tuple(kv.split("=")[0] for kv in get_task("record", shuffle_keys=True)
                      .generate(s, "train").prompt.splitlines()[1].split("; ")) for s in range(5)}
    assert len(shuffled) > 1
    derived = {"approved", "cleared", "eligible", "authorized", "qualified"}
    for s in range(30):  # without chain, no rule mentions a derived property as a condition
        rules = [l for l in get_task("joint").generate(s, "train").prompt.splitlines() if l.startswith("Anyone")]
        assert not any(w.strip(".,") in derived for r in rules for w in r.split(" is ")[1].split())


@pytest.mark.parametrize("facts", ["stated", "keyed"])
def test_joint_keyed_rules_and_facts_write_the_key_first(facts):
    """With `rules="keyed"` each rule reads `cleared: licensed and rested.` in place of `Anyone who is
    licensed and rested is cleared.`, in the prompt and in the derivation lines that copy it; with
    `facts="keyed"` each fact line reads `Kim: licensed and rested.` (`Kim: none.`). The draws are the
    sentence prompts' (same random stream): same pilots, questions and answers, the same lines
    otherwise."""
    sentence = get_task("joint", balanced=True, facts="stated")
    keyed = get_task("joint", balanced=True, rules="keyed", facts=facts)
    rule = re.compile(r"Anyone who is (.+?) is (\w+)\.")
    fact = re.compile(r"\b([A-Z][a-z]+) (?:is (.+?)|has (none) of these)\.")

    def rekey(text: str) -> str:
        text = rule.sub(r"\2: \1.", text)
        return fact.sub(lambda m: f"{m[1]}: {m[2] or m[3]}.", text) if facts == "keyed" else text

    kinds = set()
    for seed in range(100):
        a, b = sentence.sample(random.Random(seed)), keyed.sample(random.Random(seed))
        assert (a.answer, a.meta) == (b.answer, b.meta) and keyed.score(b, b.answer)["correct"]
        assert (b.prompt, b.reasoning) == (rekey(a.prompt), rekey(a.reasoning))
        assert "Anyone" not in b.prompt + b.reasoning and not (facts == "keyed" and " is " in b.reasoning)
        kinds |= {"derived" if any(b.meta["derived"]) else "base", "none" if "none" in b.prompt else "some"}
    assert kinds == {"derived", "base", "none", "some"}
    with pytest.raises(ValueError, match="rules='table' must be one of"):
        get_task("joint", rules="table")
    with pytest.raises(ValueError, match="keyed rules or facts are written without checks"):
        get_task("joint", facts=facts, rules="keyed", checks="paired")


def test_joint_counted_facts_give_how_many_before_which():
    """With `facts="counted"` each fact line, in the prompt and in every line's copy, writes the count of
    its properties where the stated form writes `is` (`Kim 2 licensed and rested.`, `Kim 0.`), under its
    own heading. The draws are the stated prompts': same pilots, questions and answers."""
    stated, counted = get_task("joint", balanced=True), get_task("joint", balanced=True, facts="counted")
    fact = re.compile(r"\b([A-Z][a-z]+) (?:is (.+?)|has none of these)\.")

    def count(m: re.Match) -> str:
        held = _stated(m[0])
        return f"{m[1]} {len(held)} {m[2]}." if held else f"{m[1]} 0."

    counts = set()
    for seed in range(200):
        a, b = stated.sample(random.Random(seed)), counted.sample(random.Random(seed))
        assert (a.answer, a.meta) == (b.answer, b.meta) and counted.score(b, b.answer)["correct"]
        heading = "Facts (how many, then which; nothing else is true):"
        assert b.prompt == fact.sub(count, a.prompt).replace("Facts (nothing else is true):", heading)
        assert b.reasoning == fact.sub(count, a.reasoning) and not re.search(r"\? [A-Z][a-z]+ (is|has) ", b.reasoning)
        counts |= {int(n) for n in re.findall(r"^[A-Z][a-z]+ (\d)\b", b.prompt, re.MULTILINE)}
    assert counts == {0, 1, 2, 3}


@pytest.mark.parametrize("derive", ["lookup", "scan"])
def test_joint_keyed_lines_rekey_the_derivation_and_leave_the_prompt_alone(derive):
    """With `line_rules="keyed"` a derivation line writes each rule it copies as `cleared: licensed and
    rested.`; the prompt keeps its sentences, and everything else is the default's, draw for draw."""
    sentence = get_task("joint", balanced=True, max_rules=3, derive=derive)
    keyed = get_task("joint", balanced=True, max_rules=3, derive=derive, line_rules="keyed")
    rule = re.compile(r"Anyone who is (.+?) is (\w+)\.")
    rekeyed = 0
    for seed in range(100):
        a, b = sentence.sample(random.Random(seed)), keyed.sample(random.Random(seed))
        assert (a.prompt, a.answer, a.meta) == (b.prompt, b.answer, b.meta) and keyed.score(b, b.answer)["correct"]
        assert "Anyone who is" in b.prompt and "Anyone" not in b.reasoning
        assert b.reasoning == rule.sub(r"\2: \1.", a.reasoning)
        rekeyed += a.reasoning != b.reasoning
    assert rekeyed > 30
    with pytest.raises(ValueError, match="line_rules='table' must be one of"):
        get_task("joint", line_rules="table")
    with pytest.raises(ValueError, match="keyed rules or facts are written without checks"):
        get_task("joint", line_rules="keyed", checks="paired")


# line_rules -> (the default line's rule part, how that form rewrites it)
KEYED_LINES = {
    "both": (r"Anyone who is (.+?) is (\w+)\.", r"\2: \1. \g<0>"),
    "keyed_first": (r"\? ([^?]+?\.) Anyone who is (.+?) is (\w+)\.", r"? \3: \2. \1 Anyone who is \2 is \3."),
    "keyed_before_fact": (r"\? ([^?]+?\.) Anyone who is (.+?) is (\w+)\.", r"? \3: \2. \1"),
}


@pytest.mark.parametrize("line_rules", KEYED_LINES)
def test_joint_keyed_lines_write_the_keyed_rule_and_its_sentence(line_rules):
    """With `line_rules="both"` a derivation line writes the rule keyed and then as the prompt's
    sentence after the fact line, `Kim is rested. cleared: licensed and rested. Anyone who is licensed
    and rested is cleared. no`; with "keyed_first" the keyed rule comes right after the question and
    the sentence after the fact line, `2. Is Kim cleared? cleared: licensed and rested. Kim is rested.
    Anyone who is licensed and rested is cleared. no`; "keyed_before_fact" writes no sentence, `2. Is
    Kim cleared? cleared: licensed and rested. Kim is rested. no`. Everything else is the default's, draw for
    draw, and the option refuses the forms it cannot write."""
    sentence, keyed = get_task("joint", balanced=True), get_task("joint", balanced=True, line_rules=line_rules)
    pattern, rewrite = KEYED_LINES[line_rules]
    rewritten = 0
    for seed in range(100):
        a, b = sentence.sample(random.Random(seed)), keyed.sample(random.Random(seed))
        assert (a.prompt, a.answer, a.meta) == (b.prompt, b.answer, b.meta) and keyed.score(b, b.answer)["correct"]
        assert b.reasoning == re.sub(pattern, rewrite, a.reasoning)
        rewritten += a.reasoning != b.reasoning
    assert rewritten > 30
    with pytest.raises(ValueError, match=f"line_rules='{line_rules}' .* needs rules='sentence' and derive='lookup'"):
        get_task("joint", line_rules=line_rules, derive="scan")
    with pytest.raises(ValueError, match=f"line_rules='{line_rules}' .* needs rules='sentence'"):
        get_task("joint", line_rules=line_rules, rules="keyed")
    with pytest.raises(ValueError, match="keyed rules or facts are written without checks"):
        get_task("joint", line_rules=line_rules, checks="paired")


@pytest.mark.parametrize("chain", [False, True])
def test_joint_scan_copies_every_rule_up_to_the_one_behind_the_property(chain):
    """With `derive="scan"` a derived line copies the prompt's rules in order, the first one first,
    and stops after the last rule behind its property; everything else (prompt, answer, base lines,
    fact lines, verdicts) is the lookup's, draw for draw."""
    lookup = get_task("joint", balanced=True, chain=chain, max_rules=3)
    scan = get_task("joint", balanced=True, chain=chain, max_rules=3, derive="scan")
    stops = set()
    for seed in range(200):
        a, b = lookup.sample(random.Random(seed)), scan.sample(random.Random(seed))
        assert (a.prompt, a.answer, a.meta) == (b.prompt, b.answer, b.meta)
        rules = [l for l in b.prompt.splitlines() if l.startswith("Anyone")]
        for line, old, derived in zip(b.reasoning.splitlines(), a.reasoning.splitlines(), b.meta["derived"]):
            if not derived:
                assert line == old
                continue
            prop = line.split("?")[0].split()[-1]
            copied = re.findall(r"Anyone who is .+? is \w+\.", line)
            assert copied == rules[:len(copied)] and copied[-1].endswith(f" is {prop}.")
            assert not any(r.endswith(f" is {prop}.") for r in copied[:-1])
            assert line.startswith(old.split(" Anyone")[0]) and line.split()[-1] == old.split()[-1]
            stops.add(len(copied))
    assert stops == {1, 2, 3}
    with pytest.raises(ValueError, match="derive='search' must be one of"):
        get_task("joint", derive="search")


def test_airspace_radii_write_each_listed_zone_radius_as_worded_and_in_km():
    """With `radii=True` the line of each zone the answer lists ends with its radius as the latest
    notice that gave one words it, then in km as the JSON writes it; cancelled zones' lines do not
    change, and the prompts and answers are those drawn without the option."""
    plain, radii = get_task("airspace", max_notices=6), get_task("airspace", max_notices=6, radii=True)
    line = re.compile(r"^(Z\d+) (active|amended), (.+) = (\d+\.\d) km\.$")
    units = set()
    for seed in range(200):
        a, b = plain.sample(random.Random(seed)), radii.sample(random.Random(seed))
        assert (a.prompt, a.answer, a.meta) == (b.prompt, b.answer, b.meta) and radii.score(b, b.answer)["correct"]
        listed = {z["id"]: z["radius_km"] for z in b.meta["zones"]}
        for before, after in zip(a.reasoning.splitlines(), b.reasoning.splitlines()):
            zone_id = before.split()[0]
            if zone_id not in listed:
                assert after == before and before.endswith(" cancelled.")
                continue
            m = line.match(after)
            assert m and f"{m[1]} {m[2]}." == before and float(m[4]) == listed[zone_id]
            worded = [n for n in b.prompt.splitlines() if zone_id in n and (" radius" in n or "AMENDED: radius" in n)]
            assert m[3] in worded[-1]  # the latest notice that gave the radius
            number, unit = re.fullmatch(r"([\d.]+) ?(\w+)", m[3]).groups()
            assert float(number) / (1000 if unit in ("m", "metres") else 1) == float(m[4])
            units.add(unit)
    assert units == {"m", "metres", "km", "kilometres"}
    with pytest.raises(ValueError, match="radii=True writes no checks"):
        get_task("airspace", radii=True, checks="paired")


@pytest.mark.parametrize("checks", ["", "paired"])
def test_airspace_amendments_copy_each_amendment_notice_into_its_zone_line(checks):
    """With `amendments=True` the line of each amended zone ends with its amendment notice, less
    `NOTICE `, where it said `Zxx amended.`; every other line, the prompt and the answer are those
    drawn without the option."""
    plain = get_task("airspace", max_notices=6, checks=checks)
    copied = get_task("airspace", max_notices=6, checks=checks, amendments=True)
    kinds = set()
    for seed in range(200):
        a, b = plain.sample(random.Random(seed)), copied.sample(random.Random(seed))
        assert (a.prompt, a.answer, a.meta) == (b.prompt, b.answer, b.meta)
        for before, after in zip(a.reasoning.splitlines(), b.reasoning.splitlines(), strict=True):
            zone_id = before.split()[0].rstrip(":")
            kind = b.meta["modified"].get(zone_id)
            if kind not in ("radius", "window"):
                assert after == before
                continue
            kinds.add(kind)
            notice = next(n for n in b.prompt.splitlines() if n.startswith(f"NOTICE {zone_id} AMENDED: "))
            assert before.endswith(f"{zone_id} amended.")
            assert after == before.removesuffix(f"{zone_id} amended.") + notice.removeprefix("NOTICE ")
    assert kinds == {"radius", "window"}
    with pytest.raises(ValueError, match="amendments=True and radii=True"):
        get_task("airspace", amendments=True, radii=True)


def test_count_ranges_are_refused_by_value():
    """Every task's min/max option pair is checked by one rule that names both options and the values."""
    for task, options, message in (
            ("copy", {"min_fragments": 5, "max_fragments": 4}, "need 1 <= min_fragments <= max_fragments, got 5..4"),
            ("airspace", {"min_notices": 1, "max_notices": 999},
             r"need 1 <= min_notices <= max_notices <= \d+, got 1..999"),
            ("joint", {"min_questions": 1, "max_questions": 4},
             "need 2 <= min_questions <= max_questions <= 8, got 1..4"),
            ("rules", {"min_questions": 0}, "need 1 <= min_questions <= max_questions, got 0..4")):
        with pytest.raises(ValueError, match=message):
            get_task(task, **options)
