"""Where the `joint` task's wrong answers go wrong, for block diffusion and AR decoding.

A `joint` answer is derived in the think block, one line per question (`clover.data.tasks.joint`):
the question copied, the pilot's fact line looked up by name, the rule(s) looked up by
property, then yes/no. For each wrong answer this finds the first part that differs from the
target derivation:

  question   the question copied wrong
  fact       the wrong fact line (lookup by the pilot's name)
  rule       the wrong rule line(s) (lookup by the property)
  checks     the written checks wrong (task option `checks`: each condition against the fact line)
  yes/no     every line right up to a wrong yes/no (the check of the lines just written)
  answer     the derivation right, the final answer line wrong
  format     a line missing, extra or unparsable

    python benchmarks/joint_errors.py --limit 40 --seed 1

Prints the first wrong line of each wrong answer and a table of the kinds per decoding mode, then the
wrong fact lines by how they differ from the right one:

  pilot      another pilot's name
  answer     only words that decide the answer added or dropped: the asked property, or the
             conditions of the rule behind it
  other      any other property added or dropped

A copy that slips at random would touch an answer word one time in three for a base question (one
of the three base properties) and two times in three for a derived one with two conditions (the
split prints those odds for the lines counted); more than that, and the answer being decided leaks
into the copy.

With `--teacher-forced` it decodes nothing: one pass per prompt over the target derivation (the clean
prefix given) tells, for each part, the share of its tokens the model predicts right (argmax) and
the share of lines whose part it predicts right throughout, causally (AR) and in block mode with the
whole block masked (the first denoising step); the verdicts are also split by kind (a base or a
derived property; yes or no) and by how many properties the fact line states (1 or 2 of 3: a model
that answers by the line's length says "no" to one and "yes" to two), and the yes/no words of
written checks are counted as `check yes` and `check no`. The last column (`alone`) predicts each
yes/no word, verdict or check, in block mode with only that token masked and the rest of its block
given (the last denoising step; one more pass per word). Where decoding errors compound, this shows
which step the model cannot do.
"""

import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

from clover.data import format_chat
from clover.data.tasks.joint import split_joined
from clover.evaluation.field_loss import teacher_forced

sys.path.insert(0, str(Path(__file__).parent))
from common import decode_task_errors, kinds_table  # noqa: E402

KINDS = ("question", "fact", "rule", "checks", "yes/no", "answer", "format")
CHECK_WORD = re.compile(r"\b(yes|no)\b|(?<=[a-z])[+-](?=[,.])")  # a written check: a word, or signed a sign
SIGN_WORD = {"+": "yes", "-": "no"}


def check_word(match: re.Match) -> str:
    """A written check's verdict, `yes` or `no`, whether the layout writes it as a word or a sign."""
    return SIGN_WORD.get(match[0], match[0])


PARTS = KINDS[:5]


def line_pieces(line: str) -> list[tuple[str, str]] | None:
    """`(part, text)` of one derivation line's parts (`PARTS`) in line order, empty ones too, None if
    unparsable: `2. Is Kim cleared? Kim is rested. Anyone who is licensed and rested is cleared.
    licensed: rested no. no` (the checks, `licensed: rested no.`, paired `rested=licensed no.`,
    signed `rested=licensed-.` or the roster's lookups `licensed=no.`,
    start at the first word with a colon or an equals sign; empty without the `checks` task option;
    keyed rules, `cleared: licensed and rested.`, are written without checks). A keyed-first line's
    rule part (joint's `line_rules="keyed_first"`) is two pieces: its keyed copy before the fact line
    and its sentence after it."""
    question, sep, rest = line.partition("? ")
    keyed = ""
    if sep and rest.startswith(f"{question.rsplit(' ', 1)[-1]}: "):
        keyed, _, rest = rest.partition(". ")
        keyed += "."
    fact, sep2, rest = rest.partition(". ")
    if not (sep and sep2):
        return None
    body, _, verdict = rest.rpartition(" ")
    marks = (body.find(":"), body.find("=")) if CHECK_WORD.search(body) else ()  # keyed rules have no checks
    mark = min((at for at in marks if at >= 0), default=-1)
    split = len(body) if mark < 0 else body.rfind(" ", 0, mark) + 1
    pieces = [("question", question), ("fact", fact), ("rule", body[:split].rstrip()), ("checks", body[split:]),
              ("yes/no", verdict)]
    if keyed:
        pieces.insert(1, ("rule", keyed))
    return pieces


def line_parts(line: str) -> tuple[str, str, str, str, str] | None:
    """`(question, fact line, rule lines, checks, yes/no)` of one derivation line (`line_pieces`; a
    keyed-first line's two rule pieces joined), None if unparsable."""
    if (pieces := line_pieces(line)) is None:
        return None
    return tuple(" ".join(text for piece, text in pieces if piece == part and text) for part in PARTS)


def part_spans(line: str) -> list[tuple[str, int, int]]:
    """`(part, start, end)` character spans of one target derivation line's non-empty pieces, in line
    order (`line_pieces`)."""
    spans, at = [], 0
    for part, text in line_pieces(line):
        if text:
            at = line.index(text, at)
            spans.append((part, at, at + len(text)))
            at += len(text)
    return spans


def verdict_kind(line: str) -> str:
    """`base yes`, `derived no`, ...: what a derivation line decides, and its answer."""
    _, _, rules, _, verdict = line_parts(line)
    return f"{'derived' if rules else 'base'} {verdict}"


def stated(line: str) -> int:
    """How many properties the pilot's fact line in a derivation line states (`Kim is a and b.`, or
    the roster's `Kim: a=yes, b=yes, c=no.`: 2)."""
    fact = line_parts(line)[1]
    return fact.count("=yes") if "=" in fact else len(fact_words(fact)[1])


FACT_SPLIT = ("pilot", "answer", "other")


def fact_words(fact: str) -> tuple[str, set[str]]:
    """`(pilot, properties)` of a fact line: `Kim is a, b and c`, `Kim: a and b`, `Kim has none of these`,
    counted `Kim 2 a and b`, `Kim 0`."""
    name, _, rest = fact.replace(":", " is", 1).partition(" ")
    count, _, listed = rest.partition(" ")
    if count.isdigit():
        rest = f"is {listed}" if listed else "has none"
    if rest.startswith("has none") or rest.endswith("none"):
        return name, set()
    return name, set(split_joined(rest.removeprefix("is "))) - {""}


def answer_words(line: str) -> set[str]:
    """The words that decide a derivation line's answer: the asked property, or the conditions of the
    rule written right after the fact line (`Anyone who is a and b is d.` or `d: a and b.`)."""
    question, _, rules, _, _ = line_parts(line)
    return set(rule_conditions(rules)) if rules else {question.rsplit(" ", 1)[-1]}


def rule_conditions(rules: str) -> list[str]:
    """The conditions, in order, of the first rule in a line's rule part (`Anyone who is a and b is d.`
    or `d: a and b.`)."""
    first = rules.split(".")[0]
    conditions = first.split(": ", 1)[1] if ": " in first else first.removeprefix("Anyone who is ").rsplit(" is ", 1)[0]
    return split_joined(conditions)


def fact_error(got: str, want: str) -> str:
    """How a wrong fact line differs from the right one (`FACT_SPLIT`)."""
    (name, words), (right_name, right_words) = (fact_words(line_parts(x)[1]) for x in (got, want))
    if name != right_name:
        return "pilot"
    return "answer" if words ^ right_words <= answer_words(want) else "other"


def teacher_forced_table(model, tokenizer, examples) -> list[str]:
    """Per part: token accuracy and lines all right, AR and block mode, and for the yes/no words
    block mode with each alone masked (see the module docstring)."""
    tokens = defaultdict(lambda: [0, 0])  # (mode, part) -> [right, total], over tokens
    lines = defaultdict(lambda: [0, 0])  # (mode, part) -> [right, total], over derivation lines
    for example in examples:
        start = format_chat(tokenizer, example, enable_thinking=True).answer.index(example.reasoning)
        units = []  # (part, [(start, end), ...]) in the answer text: each part of each line, each check
        for line in example.reasoning.splitlines():
            parts = part_spans(line)
            ranges = defaultdict(list)  # a keyed-first line's rule part has two spans
            for part, a, b in parts:
                ranges[part].append((start + a, start + b))
            units += ranges.items()
            kind, n_stated = verdict_kind(line), stated(line)
            units.append((kind, ranges["yes/no"]))  # the verdict again, under its kind
            if 0 < n_stated < 3:  # and by fact-line length where it alone does not decide a base one
                units.append((f"{kind}, {n_stated} stated", ranges["yes/no"]))
            for part, a, b in parts:  # each written check's yes/no
                if part == "checks":
                    units += [(f"check {check_word(m)}", [(start + m.start(), start + m.end())])
                              for m in CHECK_WORD.finditer(line, a, b)]
            start += len(line) + 1
        alone = [span for part, spans in units if part == "yes/no" or part.startswith("check ") for span in spans]
        forced = teacher_forced(model, tokenizer, example, enable_thinking=True, alone=alone)
        for part, spans in units:
            modes = defaultdict(list)  # mode -> hits over the unit's spans
            for s, e in spans:
                for mode, hits in forced.hits(s, e).items():
                    modes[mode] += hits
            for mode, hits in modes.items():
                tokens[mode, part][0] += sum(hits)
                tokens[mode, part][1] += len(hits)
                if hits:
                    lines[mode, part][0] += all(hits)
                    lines[mode, part][1] += 1
    rows = [f"{'part':<22}{'AR tokens':>10}{'AR lines':>10}{'block tokens':>14}{'block lines':>13}"
            f"{'alone':>7}"]
    kinds = sorted({part for _, part in lines} - set(PARTS))
    for part in [*PARTS, *kinds]:
        if ("AR", part) in lines:
            ar, block = ((tokens[m, part][0] / tokens[m, part][1], "{}/{}".format(*lines[m, part]))
                         for m in ("AR", "block"))
            alone = "-"
            if ("alone", part) in lines:
                alone = f"{tokens['alone', part][0] / tokens['alone', part][1]:.3f}"
            rows.append(f"{part:<22}{ar[0]:>10.3f}{ar[1]:>10}{block[0]:>14.3f}{block[1]:>13}{alone:>7}")
    return rows


def first_error(output: str, reasoning: str) -> tuple[str, str, str]:
    """`(kind, wrong line, target line)` for a wrong answer `output` against the target derivation."""
    think = output.split("</think>")[0].replace("<think>", "").strip().splitlines()
    target = reasoning.splitlines()
    for got, want in zip(think, target):
        if got == want:
            continue
        pieces, wanted = line_pieces(got), line_pieces(want)
        if pieces is None:
            return "format", got, want
        kind = next((part for (part, text), piece in zip(wanted, pieces) if piece != (part, text)), "format")
        return kind, got, want
    if len(think) != len(target):
        return "format", "\n".join(think[len(target):]) or "(lines missing)", "\n".join(target[len(think):])
    return "answer", output.split("</think>")[-1].strip(), ""


def main() -> None:
    probe = decode_task_errors(__doc__, "joint", teacher_forced_table)
    if probe is None:
        return
    args, task, examples, decoded = probe
    table, facts = {}, {}
    for mode, summary in decoded.items():
        kinds = table[mode] = Counter()
        facts[mode] = Counter()
        for example, text in zip(examples, summary.texts):
            if task.score(example, text)["correct"]:
                continue
            kind, got, want = first_error(text, example.reasoning)
            kinds[kind] += 1
            if kind == "fact":
                facts[mode][fact_error(got, want)] += 1
                facts[mode]["odds"] += len(answer_words(want)) / 3
            if not args.quiet:
                print(f"{mode} {kind}:\n  got:    {got}\n  target: {want}")
    print("\n" + "\n".join(kinds_table(table, len(examples), KINDS, 10)))
    print(f"\n{'wrong fact lines':<18}" + "".join(f"{k:>8}" for k in FACT_SPLIT) + "  answer by chance")
    for mode, counts in facts.items():
        print(f"{mode:<18}" + "".join(f"{counts[k]:>8}" for k in FACT_SPLIT) + f"{counts['odds']:>18.1f}")


if __name__ == "__main__":
    main()
