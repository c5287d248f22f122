"""Where joint's fact-line copies go wrong, token by token, and from which line.

A `joint` derivation line copies its pilot's fact line from the prompt by the pilot's name
(`2. Is Mia cleared? Mia is licensed and trained. ...`). Teacher-forced (the target derivation
given, one pass per prompt), this finds in each copy the first token after the name whose argmax
is wrong, causally (AR) and in block mode with the whole block masked, and tells:

  verb       the first token or two after the name (`is` against `has none of these`)
  count      the counted form's count there (`Mia 2 licensed and trained.`), written or predicted
  separator  a space, comma, `and` or the full stop between the properties
  word       a property

and whether the wrong token is what another pilot's prompt line writes after the same words
(`Mia is licensed` + `.`, from `Fay is licensed.`): a copy that follows the words it has just
written, as an induction head does, into the wrong line. Joint's prompts have up to three fact
lines over three base properties, so lines share words often.

    python benchmarks/fact_copies.py --limit 200 --seed 8
    python benchmarks/fact_copies.py --model runs/conv8/final --limit 200 --seed 8
"""

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import joint_probe_inputs  # noqa: E402
from joint_errors import part_spans  # noqa: E402
from lookup_head import FACT_LINE  # noqa: E402

PLACES = ("verb", "count", "separator", "word")
SEPARATORS = {"", ",", "and", "."}


def copies(reasoning: str) -> list[tuple[str, int, int]]:
    """`(pilot, start, end)` of each fact-line copy in a derivation (its line's fact piece,
    `joint_errors.part_spans`, wherever a keyed rule puts it): the characters after the name, from
    its space through the full stop."""
    found, at = [], 0
    for line in reasoning.split("\n"):
        for part, a, b in part_spans(line):
            if part == "fact":
                pilot = line[a:b].split(" ", 1)[0]
                found.append((pilot, at + a + len(pilot), at + b + 1))
        at += len(line) + 1
    return found


def prompt_spans(prompt: str) -> list[tuple[str, int, int]]:
    """`(pilot, start, end)` of each prompt fact line, spanned as `copies` spans a copy."""
    return [(m[1], m.start() + len(m[1]), m.end()) for m in FACT_LINE.finditer(prompt)]


def prompt_lines(prompt: str) -> dict[str, str]:
    """{pilot: what its fact line writes after the name} (`" is licensed and trained."`)."""
    return {pilot: prompt[a:b] for pilot, a, b in prompt_spans(prompt)}


def place(k: int, token: str, predicted: str = "") -> str:
    """Where the `k`-th token after the name is: the verb (the first two; the count where the target or
    the prediction is a digit), a separator, a word."""
    if k <= 1:
        return "count" if token.isdigit() or predicted.isdigit() else "verb"
    return "separator" if token.strip() in SEPARATORS else "word"


def from_another_line(written: str, predicted: str, pilot: str, lines: dict[str, str]) -> bool:
    """Whether another pilot's fact line goes on with `predicted` after the words `written` (both
    the text after the name)."""
    return any(line.startswith(written + predicted) for other, line in lines.items() if other != pilot)


def table(model, tokenizer, examples) -> list[str]:
    """Per mode, the copies, those right throughout, and the wrong ones by where their first wrong
    token is and whether another line writes it there."""
    from clover.evaluation.field_loss import teacher_forced

    counts = {mode: Counter() for mode in ("AR", "block")}
    for example in examples:
        lines = prompt_lines(example.prompt)
        forced = teacher_forced(model, tokenizer, example)
        at = forced.answer.index(example.reasoning)
        for pilot, start, end in copies(example.reasoning):
            inside = forced.tokens(at + start, at + end)
            tokens = [tokenizer.decode([t]) for t in forced.targets[inside].tolist()]
            for mode, logits in (("AR", forced.ar), ("block", forced.diff)):
                right = [forced.right[mode][k] for k in inside]
                counts[mode]["copies"] += 1
                if all(right):
                    counts[mode]["right"] += 1
                    continue
                j = right.index(False)
                predicted = tokenizer.decode([int(logits[inside[j]].argmax())])
                counts[mode][place(j, tokens[j], predicted)] += 1
                counts[mode]["another line"] += from_another_line("".join(tokens[:j]), predicted, pilot, lines)
    head = f"{'mode':<8}{'copies':>8}{'right':>8}" + "".join(f"{p:>10}" for p in PLACES) + f"{'another line':>14}"
    rows = [head]
    for mode, c in counts.items():
        rows.append(f"{mode:<8}{c['copies']:>8}{c['right']:>8}" + "".join(f"{c[p]:>10}" for p in PLACES)
                    + f"{c['another line']:>14}")
    return rows


def main() -> None:
    import torch

    model, tokenizer, examples, _ = joint_probe_inputs(__doc__, limit=200, seed=8,
                                                    what="the first wrong token of each wrong fact-line copy")
    with torch.inference_mode():
        print("\n".join(table(model, tokenizer, examples)))


if __name__ == "__main__":
    main()
