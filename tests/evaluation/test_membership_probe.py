"""`benchmarks/membership_probe.py`'s synthetic prompts ask what `joint`'s base check asks."""

import random

import pytest
import torch

from benchmark_script import load_benchmark

probe = load_benchmark("membership_probe")


def _check(tokens: list[int], layout: str) -> tuple[int, int, list[int]]:
    """(asked pilot, asked property, properties the check after the question lists)."""
    ask = tokens.index(probe.ASK)
    name, asked, qmark = tokens[ask + 1: ask + 4]
    assert qmark == probe.QMARK
    check = tokens[ask + 4:]
    if layout == "plain":
        assert check[:2] == [name, probe.IS] and check[-1] == probe.DOT
        return name, asked, [t for t in check[2:-1] if t != probe.AND]
    assert check[0] == probe.OPEN and check[-1] == probe.CLOSE
    return name, asked, check[1:-1]


@pytest.mark.parametrize("layout", ["plain", "marked"])
def test_the_answer_is_whether_the_asked_property_is_in_the_pilots_fact_line(layout):
    rng, answers = random.Random(0), []
    for _ in range(300):
        tokens, answer, stated, start = probe.sample(rng, layout, spaces=False)
        assert tokens[start - 1] == probe.QMARK  # the response is the check after the question
        name, asked, listed = _check(tokens, layout)
        prompt_line = tokens[tokens.index(name):tokens.index(probe.DOT, tokens.index(name)) + 1]
        assert prompt_line == probe.fact_line(name, listed)  # the check copies the pilot's own line
        assert answer == (probe.YES if asked in listed else probe.NO)
        assert stated == len(listed)
        answers.append(answer)
    assert 0.4 < answers.count(probe.YES) / len(answers) < 0.75


def test_spaces_follow_every_word_and_change_nothing_else():
    for seed in range(20):
        plain, answer, stated, start = probe.sample(random.Random(seed), "marked", spaces=False)
        spaced = probe.sample(random.Random(seed), "marked", spaces=True)
        assert spaced[0][0::2] == plain and set(spaced[0][1::2]) == {probe.SPACE}
        assert spaced[1:] == (answer, stated, 2 * start)


def test_batches_are_left_padded_so_the_answer_is_predicted_at_the_last_position():
    ids, mask, answers, stated, _ = probe.batch(random.Random(1), 8, "plain", spaces=True)
    assert ids.shape == mask.shape and ids.shape[0] == 8 == len(answers) == len(stated)
    assert bool(mask[:, -1].all()) and bool((ids[mask == 0] == probe.PAD).all())
    assert bool((ids[:, -1] == probe.SPACE).all())
    logits = probe.small_model(0)(ids, attention_mask=mask).logits
    assert logits.shape == (*ids.shape, probe.VOCAB) and torch.isfinite(logits).all()


def test_rules_come_first_and_name_base_properties():
    for seed in range(50):
        tokens, answer, stated, start = probe.sample(random.Random(seed), "plain", spaces=False, rules=True)
        first_end = tokens.index(probe.DOT) + 1
        lines = [tokens[:first_end], tokens[first_end:tokens.index(probe.DOT, first_end) + 1]]
        for line, derived in zip(lines, probe.DERIVED):  # `R p and q is D .`
            assert line[0] == probe.RULE and line[-3:] == [probe.IS, derived, probe.DOT]
            assert 1 <= len([t for t in line if t in probe.PROPERTIES]) <= 2
        rest = tokens[len(lines[0]) + len(lines[1]):]
        assert probe.RULE not in rest and not set(rest) & set(probe.DERIVED)
        assert tokens[start - 1] == probe.QMARK and answer in (probe.YES, probe.NO)


def test_the_question_list_holds_the_asked_question_among_others():
    for seed in range(50):
        tokens, answer, stated, start = probe.sample(random.Random(seed), "plain", spaces=False, questions=True)
        asks = [i for i, t in enumerate(tokens) if t == probe.ASK]
        pairs = [tuple(tokens[i + 1:i + 3]) for i in asks]
        assert all(tokens[i + 3] == probe.QMARK for i in asks) and asks[-1] == start - 4
        assert 2 <= len(pairs) - 1 <= 4 and pairs[-1] in pairs[:-1]  # the list, then the asked one again
        assert len(set(pairs[:-1])) == len(pairs) - 1 and all(p in probe.PROPERTIES for _, p in pairs)


def test_the_response_loss_covers_the_check_and_the_answer():
    ids, mask, answers, stated, response = probe.batch(random.Random(2), 6, "marked", spaces=False)
    for row in range(6):
        real = ids[row][mask[row].bool()].tolist()
        kept = ids[row, 1:][response[row, :-1]].tolist()  # the tokens the response positions predict
        assert kept == real[real.index(probe.QMARK) + 1:] and kept[0] == probe.OPEN and kept[-1] == probe.CLOSE
    logits = torch.randn(*ids.shape, probe.VOCAB)
    answer_only = probe.probe_loss(logits, ids, answers, None)
    assert torch.isclose(answer_only, torch.nn.functional.cross_entropy(logits[:, -1], answers))
    whole = probe.probe_loss(logits, ids, answers, response)
    n = int(response.sum()) + 6
    expected = (torch.nn.functional.cross_entropy(logits[:, :-1][response[:, :-1]], ids[:, 1:][response[:, :-1]],
                                                  reduction="sum") + answer_only * 6) / n
    assert torch.isclose(whole, expected)


@pytest.mark.parametrize("layout", ["plain", "marked"])
def test_the_derivation_answers_every_listed_question_in_turn(layout):
    for seed in range(100):
        tokens, answer, stated, start = probe.sample(random.Random(seed), layout, spaces=False, questions=True,
                                                     derivation=True)
        listed, response = tokens[:start], tokens[start:] + [answer]
        asks = [i for i, t in enumerate(listed) if t == probe.ASK]
        pairs = [tuple(listed[i + 1:i + 3]) for i in asks]
        assert 2 <= len(pairs) <= 4 and len(set(pairs)) == len(pairs)
        lines, line = [], []
        for t in response:  # split the response after each verdict
            line.append(t)
            if t in (probe.YES, probe.NO):
                lines.append(line)
                line = []
        assert line == [] and len(lines) == len(pairs)  # one line per listed question, in the list's order
        for (name, prop), line in zip(pairs, lines):
            assert line[:4] == [probe.ASK, name, prop, probe.QMARK]
            facts = listed[listed.index(name):listed.index(probe.DOT, listed.index(name)) + 1]
            held = [t for t in facts[2:-1] if t != probe.AND]
            assert line[4:-1] == (facts if layout == "plain" else [probe.OPEN, *held, probe.CLOSE])
            assert line[-1] == (probe.YES if prop in held else probe.NO)
        assert stated == len(held)  # of the asked pilot: the last line's


def test_the_derivation_needs_the_question_list(monkeypatch):
    monkeypatch.setattr("sys.argv", ["membership_probe.py", "--derivation"])
    with pytest.raises(SystemExit):
        probe.main()
