"""Where the `joint` task's wrong answers go wrong, for block diffusion and AR decoding.

A `joint` answer is derived in the think block, one line per question (`clover.data.tasks.joint`):
the question copied, the pilot's fact line looked up by name, the rule(s) looked up by
property, then yes/no. For each wrong answer this finds the first part that differs from the
target derivation:

  question   the question copied wrong
  fact       the wrong fact line (lookup by the pilot's name)
  rule       the wrong rule line(s) (lookup by the property)
  yes/no     every line right up to a wrong yes/no (the check of the lines just written)
  answer     the derivation right, the final answer line wrong
  format     a line missing, extra or unparsable

    python benchmarks/joint_errors.py --limit 40 --seed 1

Prints the first wrong line of each wrong answer and a table of the kinds per decoding mode.
"""

import sys
from collections import Counter
from pathlib import Path

import torch

from clover.data import eval_examples, get_task
from clover.evaluation.run import decode_all

sys.path.insert(0, str(Path(__file__).parent))
from common import embedded_probe_parser, load_probe_model  # noqa: E402

KINDS = ("question", "fact", "rule", "yes/no", "answer", "format")


def line_parts(line: str) -> tuple[str, str, str, str] | None:
    """`(question, fact line, rule lines, yes/no)` of one derivation line, None if unparsable:
    `2. Is Kim cleared? Kim is rested. Anyone who is licensed and rested is cleared. no`."""
    question, sep, rest = line.partition("? ")
    fact, sep2, rest = rest.partition(". ")
    if not (sep and sep2):
        return None
    rules, _, verdict = rest.rpartition(" ")
    return question, fact, rules, verdict


def first_error(output: str, reasoning: str) -> tuple[str, str, str]:
    """`(kind, wrong line, target line)` for a wrong answer `output` against the target derivation."""
    think = output.split("</think>")[0].replace("<think>", "").strip().splitlines()
    target = reasoning.splitlines()
    for got, want in zip(think, target):
        if got == want:
            continue
        parts, wanted = line_parts(got), line_parts(want)
        if parts is None:
            return "format", got, want
        kind = next((k for k, a, b in zip(KINDS, parts, wanted) if a != b), "format")
        return kind, got, want
    if len(think) != len(target):
        return "format", "\n".join(think[len(target):]) or "(lines missing)", "\n".join(target[len(think):])
    return "answer", output.split("</think>")[-1].strip(), ""


def main() -> None:
    parser = embedded_probe_parser(__doc__, limit_help="joint prompts")
    parser.add_argument("--quiet", action="store_true", help="only the table")
    args = parser.parse_args()
    path, model, tokenizer = load_probe_model(args)
    task = get_task("joint")
    examples = eval_examples(args.limit, seed=args.seed, tasks=[task])
    size, threshold = model.generation_config.block_size, model.generation_config.threshold
    modes = {"block_diffusion": {"max_new_tokens": 512, "block_size": size, "threshold": threshold},
             "ar": {"max_new_tokens": 512}}
    print(f"model {path}, {len(examples)} joint prompts (seed {args.seed}), thinking on, greedy\n")
    with torch.inference_mode():
        decoded = decode_all(model, tokenizer, examples, modes)
    table = {}
    for mode, summary in decoded.items():
        kinds = table[mode] = Counter()
        for example, text in zip(examples, summary.texts):
            if task.score(example, text)["correct"]:
                continue
            kind, got, want = first_error(text, example.reasoning)
            kinds[kind] += 1
            if not args.quiet:
                print(f"{mode} {kind}:\n  got:    {got}\n  target: {want}")
    print(f"\n{'mode':<16}{'right':>7}{'wrong':>7}" + "".join(f"{k:>10}" for k in KINDS))
    for mode, kinds in table.items():
        wrong = sum(kinds.values())
        print(f"{mode:<16}{len(examples) - wrong:>7}{wrong:>7}" + "".join(f"{kinds[k]:>10}" for k in KINDS))


if __name__ == "__main__":
    main()
