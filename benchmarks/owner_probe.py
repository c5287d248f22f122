"""Does a fact line's list of properties know whose line it is? Linear probes for the line's pilot.

Joint's wrong fact-line copies follow the words just written into another pilot's line
(`fact_copies.py`: `Mia is licensed` + `.` from `Fay is licensed.`). A copy that goes by the
previous word alone cannot tell two lines that share it; one that matches the line's pilot too
needs the pilot held at every token of the list, where the copy's keys are read (the prompt's
line) and where its query is (the derivation's copy). A linear probe (`lookup_probe.probe_accuracy`:
softmax regression fitted on the first 3/4 of the tokens, scored on the rest) on the residual stream
after the embedding and after each decoder layer asks which pilot's line a token is in, at:

- **prompt, first word**: the line's first property (or `has`), right after the pilot and `is`;
- **prompt, later**: every later token of the list (separators and words) up to the full stop;
- **copy, first word** and **copy, later**: the same tokens of the derivation's copies.

Only prompts with two or three pilots count (one pilot's line has nothing to be told from).
Causal forwards over prompt and teacher-forced answer (what AR decoding sees), thinking on.

    python benchmarks/owner_probe.py --limit 400 --seed 20
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from fact_copies import copies, prompt_spans  # noqa: E402
from lookup_probe import joint_probe_inputs, layer_cells, layer_table_head, most_common_share, residuals  # noqa: E402

PLACES = ("prompt, first word", "prompt, later", "copy, first word", "copy, later")


def list_tokens(offsets: list[tuple[int, int]], start: int, end: int) -> list[int]:
    """The tokens inside characters [start, end)."""
    return [k for k, (a, b) in enumerate(offsets) if start <= a and b <= end and b > a]


def list_span(text: str, start: int, end: int) -> tuple[int, int]:
    """The list of a fact line whose text after the pilot spans [start, end) (`fact_copies`): from
    after `is ` to the full stop (` is a and b.` -> `a and b`; ` has none of these.` -> `has none of
    these`)."""
    return start + (len(" is ") if text.startswith(" is ", start) else 1), end - 1


def owner_samples(model, tokenizer, examples) -> dict[str, tuple[list[torch.Tensor], list[str]]]:
    """{place: (residuals [L + 1, D] at each token of `PLACES`, the line's pilot)}."""
    from clover.data.corpus import format_chat

    samples = {place: ([], []) for place in PLACES}
    for example in examples:
        lines = prompt_spans(example.prompt)
        if len(lines) < 2:
            continue
        chat = format_chat(tokenizer, example, enable_thinking=True)
        text = chat.prompt + chat.answer
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = [tuple(span) for span in encoded["offset_mapping"]]
        stream = residuals(model, encoded.input_ids)
        at_prompt = chat.prompt.index(example.prompt)
        at_answer = len(chat.prompt) + chat.answer.index(example.reasoning)
        spans = [("prompt", pilot, at_prompt + a, at_prompt + b) for pilot, a, b in lines]
        spans += [("copy", pilot, at_answer + a, at_answer + b) for pilot, a, b in copies(example.reasoning)]
        for side, pilot, start, end in spans:
            start, end = list_span(text, start, end)
            for j, k in enumerate(list_tokens(offsets, start, end)):
                place = f"{side}, {'first word' if j == 0 else 'later'}"
                samples[place][0].append(stream[:, k])
                samples[place][1].append(pilot)
    return samples


def main() -> None:
    args, path, model, tokenizer, examples = joint_probe_inputs(__doc__)
    with torch.inference_mode():
        samples = owner_samples(model, tokenizer, examples)
    print(f"model {path}, {args.limit} joint prompts of seed {args.seed} (those with two or three pilots): "
          f"which pilot's line each token is in, probes fitted on the first 3/4, held-out accuracy\n")
    print("\n".join(layer_table_head(model, ["tokens", "n", "most common label"])))
    for place in PLACES:
        features, labels = samples[place]
        cells = layer_cells(features, labels)
        print(f"| {place} | {len(labels)} | {most_common_share(labels):.2f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
