"""How often joint's named-roster lines look their values up right, teacher-forced.

With joint's facts as a roster that names the pilot at each value (`facts="named"`: `Kim
licensed=no, Kim rested=yes.`; `"marked"`: `Kim licensed-, Kim rested+.`) a derivation line copies no
fact line: after the question it writes the rule(s) behind a derived property, then looks each
condition up by pilot and property, then answers: `2. Is Kim cleared? Anyone who is licensed and
rested is cleared. Kim licensed=no, Kim rested=yes. no`. Teacher-forced (the target derivation given,
one pass per prompt), this counts, by the argmax of each mode (AR, and block mode with the whole
block masked), the parts that are right throughout:

  rule      a copied rule sentence
  key       a lookup's pilot and property (`Kim licensed`)
  value     a looked-up value (`no`, or the sign), by what the roster holds
  line      a line whose values are all right (the stated form's unit: a fact-line copy)
  verdict   the answer word that ends the line

    python benchmarks/roster_lookups.py --option 'facts="marked"' --limit 100 --seed 8
    python benchmarks/roster_lookups.py --checkpoint runs/marked_b/checkpoints/step-0002000 --option 'facts="marked"'
"""

import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import joint_probe_inputs  # noqa: E402
from joint_errors import SIGN_WORD  # noqa: E402

PARTS = ("rule", "key", "value yes", "value no", "line", "verdict")
RULE = re.compile(r"Anyone who is .*? is \w+\.")
LOOKUP = re.compile(r"(\w+ \w+)(?:=(yes|no)|([+-]))")  # `Kim rested=yes` or `Kim rested+`


def parts(line: str) -> list[tuple[str, int, int]]:
    """`(part, start, end)` character spans of one derivation line's rules, lookup keys, values (as
    `value yes` / `value no`) and verdict, in line order; the lookups are those after the question."""
    asked = line.index("? ") + 2
    found = [("rule", m.start(), m.end()) for m in RULE.finditer(line, asked)]
    for m in LOOKUP.finditer(line, asked):
        group = 2 if m[2] else 3
        word = m[2] or SIGN_WORD[m[3]]
        found += [("key", m.start(1), m.end(1)), (f"value {word}", m.start(group), m.end(group))]
    verdict = line.rsplit(" ", 1)[1]
    return sorted(found, key=lambda span: span[1]) + [("verdict", len(line) - len(verdict), len(line))]


def table(model, tokenizer, examples) -> list[str]:
    """Per mode, each part's right count of all, over every line of `examples`."""
    from clover.evaluation.field_loss import teacher_forced

    counts = {mode: Counter() for mode in ("AR", "block")}
    for example in examples:
        forced = teacher_forced(model, tokenizer, example)
        at = forced.answer.index(example.reasoning)
        for line in example.reasoning.split("\n"):
            spans = [(part, forced.tokens(at + start, at + end)) for part, start, end in parts(line)]
            for mode, count in counts.items():
                rights = [(part, all(forced.right[mode][k] for k in tokens)) for part, tokens in spans]
                for part, right in rights:
                    count[part] += 1
                    count[f"{part} right"] += right
                count["line"] += 1
                count["line right"] += all(right for part, right in rights if part.startswith("value"))
            at += len(line) + 1
    rows = [f"{'mode':<8}" + "".join(f"{part:>16}" for part in PARTS)]
    for mode, c in counts.items():
        rows.append(f"{mode:<8}" + "".join(f"{c[part + ' right']:>9} / {c[part]:<4}" for part in PARTS))
    return rows


def main() -> None:
    import torch

    model, tokenizer, examples, _ = joint_probe_inputs(__doc__, limit=100, seed=8,
                                                    what="the named roster's lookups, right throughout")
    if not any(part.startswith("value") for e in examples for line in e.reasoning.split("\n")
               for part, _, _ in parts(line)):
        raise SystemExit("these prompts' lines look nothing up: pass --option 'facts=\"named\"' or "
                         "--option 'facts=\"marked\"'")
    with torch.inference_mode():
        print("\n".join(table(model, tokenizer, examples)))


if __name__ == "__main__":
    main()
