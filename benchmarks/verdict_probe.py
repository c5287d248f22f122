"""Does the model check a rule against the fact line? Linear probes at joint's derived verdicts.

A derived line ends with a check: `2. Is Kim cleared? Kim is rested. cleared: licensed and rested.
no` is "no" because the fact line lacks `licensed`. The models of the keyed-rule lineage answer it by
the fact line's length ("no" from one stated property, "yes" from two; `joint_errors.py
--teacher-forced`). A linear probe (`lookup_probe.probe_accuracy`: softmax regression fitted on the
first 3/4 of the lines, scored on the rest) on the residual stream after the embedding and after
each decoder layer, at the position that predicts the verdict, asks:

- **verdict**: is the right yes/no held there?
- **verdict, where the length misleads**: the same probe, scored only on the held-out lines whose
  answer the length does not give (yes from one stated property, no from two). A model that checks
  holds it; one that counts does no better there than the most common label (the table's second
  column, here scored on those lines alone);
- **first condition held**, **second condition held**: is each of the rule's conditions in the fact line;
- **stated**: how many properties the fact line states (what a count would read).

Causal forwards over prompt and teacher-forced answer (what AR decoding sees), thinking on.

    python benchmarks/verdict_probe.py --limit 400 --seed 20
    python benchmarks/verdict_probe.py --model runs/lookup-head-a3/final --line-rules keyed --limit 400 --seed 20
"""

import sys
from pathlib import Path

import torch

from clover.data.tasks.joint import length_misleads

sys.path.insert(0, str(Path(__file__).parent))
from joint_errors import fact_words, line_parts, rule_conditions  # noqa: E402
from lookup_probe import (joint_probe_inputs, layer_cells, layer_table_head, most_common_share, residuals,  # noqa: E402
                          token_at)

MISLEADS = "verdict, where the length misleads"
PROBES = ("verdict", MISLEADS, "first condition held", "second condition held", "stated")


def verdict_samples(model, tokenizer, examples) -> dict[str, tuple[list[torch.Tensor], list[str]]]:
    """{probe: (residuals [L + 1, D] at the position that predicts each derived verdict, labels)}; the
    misleading probe's samples are the verdict's own (the same lists: it is scored on a subset,
    `misleads`)."""
    from clover.data.corpus import format_chat

    samples = {probe: ([], []) for probe in PROBES if probe != MISLEADS}
    samples[MISLEADS] = samples["verdict"]
    for example in examples:
        chat = format_chat(tokenizer, example, enable_thinking=True)
        text = chat.prompt + chat.answer
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = [tuple(span) for span in encoded["offset_mapping"]]
        stream = residuals(model, encoded.input_ids)
        at = len(chat.prompt) + chat.answer.index(example.reasoning)
        for line in example.reasoning.splitlines():
            _, fact, rules, _, verdict = line_parts(line)
            start, at = at, at + len(line) + 1
            if not rules:
                continue
            held, conditions = fact_words(fact)[1], rule_conditions(rules)
            position = token_at(offsets, start + len(line) - len(verdict)) - 1
            labels = {"verdict": verdict, "first condition held": str(conditions[0] in held), "stated": str(len(held))}
            if len(conditions) > 1:
                labels["second condition held"] = str(conditions[1] in held)
            for probe, label in labels.items():
                samples[probe][0].append(stream[:, position])
                samples[probe][1].append(label)
    return samples


def misleads(labels: list[str], stated: list[str]) -> list[bool]:
    """Per line: a verdict other than the fact line's length suggests (yes from two or more stated)."""
    return [length_misleads(verdict == "yes", int(n)) for verdict, n in zip(labels, stated)]


def main() -> None:
    args, path, model, tokenizer, examples = joint_probe_inputs(__doc__)
    with torch.inference_mode():
        samples = verdict_samples(model, tokenizer, examples)
    verdicts, stated = samples["verdict"][1], samples["stated"][1]
    subset = misleads(verdicts, stated)
    held_out = int(len(verdicts) * 0.75)
    print(f"model {path}, {args.limit} joint prompts of seed {args.seed}: {len(verdicts)} derived lines "
          f"({sum(subset[held_out:])} held-out where the length misleads), probes fitted on the first 3/4, "
          f"held-out accuracy\n")
    print("\n".join(layer_table_head(model, ["probe", "most common label"])))
    for probe in PROBES:
        features, labels = samples[probe]
        scored = subset if probe == MISLEADS else None
        cells = layer_cells(features, labels, scored)
        print(f"| {probe} | {most_common_share(labels, scored=scored):.2f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
