"""How often the model copies the right rule: on `joint`'s derivation lines and on the `rules` drill.

A derived property's line copies the rule behind it: `2. Is Kim cleared? Kim is rested. Anyone who
is licensed and rested is cleared. no`. The rule is found by its property, which the sentence form
writes last, after the conditions it decides by (a backward lookup); the keyed form, `cleared:
licensed and rested.`, writes it first. Under teacher forcing (the target given as prefix, causal
mode, what AR decoding sees) this counts the rule copies whose every token from the first condition
to the rule's end is the model's most likely token, on joint's lines (2 or 3 rules in a prompt) and
on the drill's (2 to 4; `clover.data.tasks.rules`), by the number of rules in the prompt and by
place in the line (with `--derive scan` joint's lines copy every rule up to the one behind their
property, and each copy counts against its own rule: a rule the scan passes, or the one behind). Each wrong
token is put down to where it comes from: a condition of another rule, a property of the fact line
written just before, both, neither, or a wrong count of conditions (`and` against the rule's end).
The rule's full stop counts as right whatever the tokenizer glues to it (`.` or `.` and a newline:
where the line ends is not the lookup).

    python benchmarks/rule_lookups.py --limit 80 --seed 3
    python benchmarks/rule_lookups.py --checkpoint runs/rules-a/checkpoints/step-0001000 --limit 80 --seed 3
    python benchmarks/rule_lookups.py --drill keyed --limit 80 --seed 3
    python benchmarks/rule_lookups.py --derive scan --checkpoint runs/scan-a/checkpoints/step-0001000 --limit 40 --seed 3
    python benchmarks/rule_lookups.py --line-rules keyed --checkpoint runs/keyed-lines/checkpoints/step-0001000 --limit 40 --seed 3
"""

import re
import sys
from collections import Counter
from pathlib import Path

from clover.data.tasks.joint import LINE_RULE_FORMS

sys.path.insert(0, str(Path(__file__).parent))
from common import embedded_probe_parser, load_probe_model  # noqa: E402

SENTENCE = re.compile(r"Anyone who is (.+?) is (\w+)\.")
KEYED = re.compile(r"^(\w+): (.+?)\.$", re.MULTILINE)  # a keyed rule line, `cleared: licensed and rested.`
COUNT_WORDS = ("and", "is", ".", "")  # a condition more or one fewer than the rule has ("": a space,
# its own token in the shipped tokenizer, before another condition)


def prompt_rules(prompt: str) -> dict[str, str]:
    """{derived property: its conditions as written} for the rules block of a joint or drill prompt."""
    block = prompt.split("Facts")[0]
    rules = {m[2]: m[1] for m in SENTENCE.finditer(block)}
    return rules or {m[1]: m[2] for m in KEYED.finditer(block)}


def rule_copies(text: str) -> list[tuple[int, int, str, str, str]]:
    """`(start, end, rule's property, fact line, place)` of each rule copied in a derivation or drill
    answer `text`: [start, end) spans the characters from the first condition to the rule's final full
    stop. A line copies the rule behind its asked property, and in joint's scan (`derive="scan"`) the
    rules before it too; `place` says which of the line's copies it is and whether the line's
    question asks its property: `1st, behind`, `1st, passed` (a scan goes on past it), `2nd, behind`.
    A line that writes its rule keyed (`line_rules` "keyed", "both" or "keyed_first") has one copy, the
    keyed one: the sentence that "both" and "keyed_first" write after it is a copy of that copy, not a
    lookup."""
    copies, at = [], 0
    for line in text.splitlines(keepends=True):
        question, _, rest = line.partition("? ")
        asked = question.split()[-1] if question else ""
        if asked and rest.startswith(f"{asked}: "):  # keyed_first: the keyed copy, then the fact line
            rest = rest.partition(". ")[2]
        fact = rest.partition(". ")[0]
        if asked and (keyed := re.search(rf"[.?] {re.escape(asked)}: (.+?\.)", line)):
            copies.append((at + keyed.start(1), at + keyed.end(1), asked, fact, _place(0, True)))
        elif sentences := list(SENTENCE.finditer(line)):
            copies += [(at + m.start(1), at + m.end(), m[2], fact, _place(k, m[2] == asked))
                       for k, m in enumerate(sentences)]
        at += len(line)
    return copies


def _place(k: int, behind: bool) -> str:
    """`2nd, behind`: the k-th copy of a line (joint has at most 3 rules), and whether it is the rule behind."""
    return f"{('1st', '2nd', '3rd')[k]}, {'behind' if behind else 'passed'}"


def _fractions(tally: Counter, keys, label) -> list[str]:
    """`label(key) right/copied` for each key of a tally of `(key, right)` pairs."""
    return [f"{label(key)} {tally[key, True]}/{tally[key, True] + tally[key, False]}" for key in keys]


def error_source(got: str, asked: str, rules: dict[str, str], fact: str) -> str:
    """Where a wrong token of the rule for `asked` comes from (see the module docstring)."""
    if got in COUNT_WORDS:
        return "count"
    other = {w for prop, conditions in rules.items() if prop != asked for w in conditions.split()}
    in_other, in_fact = got in other, got in fact.replace(",", " ").split()
    return {(True, True): "other rule and fact line", (True, False): "other rule",
            (False, True): "fact line", (False, False): "neither"}[in_other, in_fact]


def lookup_rows(model, tokenizer, groups: dict[str, list]) -> list[str]:
    """Per group of examples (name -> examples): rule copies right under teacher forcing, in all and
    by the number of rules in the prompt, and the wrong tokens by source."""
    from clover.evaluation.field_loss import teacher_forced

    rows = []
    for name, examples in groups.items():
        by_rules, by_place, sources = Counter(), Counter(), Counter()  # (rules in the prompt | place, right)
        for example in examples:
            text = example.reasoning or example.answer
            rules = prompt_rules(example.prompt)
            forced = teacher_forced(model, tokenizer, example, enable_thinking=True)
            start = forced.answer.index(text)
            predicted = forced.ar.argmax(-1)
            for a, b, prop, fact, place in rule_copies(text):
                wrong = []
                for k in forced.tokens(start + a, start + b):
                    if forced.right["AR"][k]:
                        continue
                    got, want = (tokenizer.decode([int(ids[k])]) for ids in (predicted, forced.targets))
                    if not got[:1] == want[:1] == ".":  # the full stop is right, whatever is glued to it
                        wrong.append(got.strip())
                by_rules[len(rules), not wrong] += 1
                by_place[place, not wrong] += 1
                sources.update(error_source(got, prop, rules, fact) for got in wrong)
        hits, total = sum(n for (_, ok), n in by_rules.items() if ok), sum(by_rules.values())
        counts = ", ".join(_fractions(by_rules, sorted({n for n, _ in by_rules}), lambda n: f"{n} rules"))
        rows.append(f"{name}: {hits}/{total} rule copies right ({hits / max(total, 1):.3f}; {counts})")
        places = _fractions(by_place, sorted({place for place, _ in by_place}), str)
        rows.append("  by place in the line: " + "; ".join(places))
        rows.append("  wrong tokens: " + (", ".join(f"{s} {c}" for s, c in sources.most_common()) or "none"))
    return rows


def main() -> None:
    import torch

    from clover.data import eval_examples, get_task

    parser = embedded_probe_parser(__doc__, limit_help="prompts of each task")
    parser.add_argument("--derive", choices=("lookup", "scan"), default="lookup",
                        help="how joint's derived lines copy their rules")
    parser.add_argument("--line-rules", choices=LINE_RULE_FORMS, default="sentence",
                        help="the form of the rules joint's lines write (the prompt keeps its sentences)")
    parser.add_argument("--drill", choices=("sentence", "keyed"), default="sentence",
                        help="the form of the drill's rules")
    args = parser.parse_args()
    path, model, tokenizer = load_probe_model(args)
    joint = get_task("joint", derive=args.derive, line_rules=args.line_rules)
    groups = {f"joint ({args.derive}, {args.line_rules} lines)": eval_examples(args.limit, seed=args.seed, tasks=[joint]),
              f"rules drill ({args.drill})": eval_examples(args.limit, seed=args.seed,
                                                           tasks=[get_task("rules", rules=args.drill)])}
    print(f"model {path}, seed {args.seed}, teacher-forced, causal\n")
    with torch.inference_mode():
        print("\n".join(lookup_rows(model, tokenizer, groups)))


if __name__ == "__main__":
    main()
