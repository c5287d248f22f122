"""Where block diffusion departs from AR decoding of the same checkpoint, and how sure it was.

For each held-out prompt, greedy block diffusion and greedy AR; where their token sequences
differ, the first differing token of block diffusion and the confidence at which the
low-confidence rule committed it (from the decoding's step events), beside AR's confidence in
its own token there, and how many positions of its block to its left were still masked when it
was committed (AR always has them all). A commit at or below the
threshold was the rule's fallback (no masked position was sure enough, so the most confident
one was filled); one above it was a confident mistake.

    python benchmarks/departures.py --limit 40 --seed 1 [--no-thinking]

Prints one line per departure and a table per task: prompts, departures, prompts only AR gets
right, and how many of those departed through a fallback commit.
"""

import sys
from collections import Counter
from pathlib import Path

import torch

from clover.data import eval_examples, get_task
from clover.evaluation.run import prompt_ids
from clover.model.generation_batch import DoneEvent, StepEvent

sys.path.insert(0, str(Path(__file__).parent))
from common import embedded_probe_parser, load_probe_model  # noqa: E402


def block_diffusion_with_confidence(model, ids, threshold: float, max_new_tokens: int):
    """(new token ids, the confidence each was committed at, the denoising step that filled each)
    for one prompt [1, T]."""
    size = model.generation_config.block_size
    committed: dict[int, tuple[float, int]] = {}  # response position -> (confidence, event index) when filled
    events = model.stream_generate(ids, mode="block_diffusion", do_sample=False, threshold=threshold,
                                   max_new_tokens=max_new_tokens, block_size=size)
    for step, event in enumerate(events):
        if isinstance(event, StepEvent):
            confidence = event.confidence[0].tolist()  # one copy per step, not one per position
            for j in event.filled[0].nonzero().flatten().tolist():
                committed[event.block_index * size + j] = (confidence[j], step)
        elif isinstance(event, DoneEvent):
            new = event.output.response_ids(0, ids.shape[1])
    confidence, filled_at = zip(*(committed[i] for i in range(len(new))))
    return new.tolist(), list(confidence), list(filled_at)


def masked_to_the_left(filled_at: list[int], i: int, size: int) -> int:
    """Positions of `i`'s block to the left of `i` still masked when `i` was decided (filled in the
    same step or later)."""
    return sum(filled_at[j] >= filled_at[i] for j in range(i - i % size, i))


def ar_confidence(model, ids, ar: list[int], i: int) -> float:
    """AR's confidence in its token `ar[i]`: the causal next-token probability after the prompt [1, T]
    and `ar[:i]` (the mask token excluded, as in block diffusion)."""
    context = torch.cat((ids, torch.tensor([ar[:i]], dtype=ids.dtype)), dim=1)
    logits = model(context).logits[0, -1].float()
    logits[model.config.mask_token_id] = float("-inf")
    return logits.softmax(-1)[ar[i]].item()


def main() -> None:
    parser = embedded_probe_parser(__doc__)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--no-thinking", dest="thinking", action="store_false", default=None,
                        help="prompts with thinking off (default: the template's)")
    args = parser.parse_args()
    path, model, tokenizer = load_probe_model(args)
    threshold = model.generation_config.threshold
    examples = eval_examples(args.limit, seed=args.seed)
    thinking = "the template's default" if args.thinking is None else "off"
    print(f"model {path}, {len(examples)} prompts (seed {args.seed}), threshold {threshold}, thinking {thinking}, "
          "greedy\n")
    counts: dict[str, Counter] = {}
    with torch.inference_mode():
        for example in examples:
            task, c = get_task(example.task), counts.setdefault(example.task, Counter())
            ids = prompt_ids(model, tokenizer, example, enable_thinking=args.thinking)
            bd, confidence, filled_at = block_diffusion_with_confidence(model, ids, threshold, args.max_new_tokens)
            out = model.generate(ids, mode="ar", do_sample=False, max_new_tokens=args.max_new_tokens,
                                 return_dict_in_generate=True)
            ar = out.response_ids(0, ids.shape[1]).tolist()
            bd_right = task.score(example, tokenizer.decode(bd))["correct"]
            ar_right = task.score(example, tokenizer.decode(ar))["correct"]
            c["prompts"] += 1
            i = next((i for i, (b, a) in enumerate(zip(bd, ar)) if b != a), None)
            if i is None:
                continue
            fallback = confidence[i] <= threshold
            left = masked_to_the_left(filled_at, i, model.generation_config.block_size)
            c["departures"] += 1
            c["ar only"] += ar_right and not bd_right
            c["ar only, by fallback"] += ar_right and not bd_right and fallback
            c["departures by fallback"] += fallback
            c["filled before its left"] += left > 0
            print(f"{example.task:<9} token {i:>3}: {tokenizer.decode(bd[i:i + 1])!r} for AR's "
                  f"{tokenizer.decode(ar[i:i + 1])!r} at confidence {confidence[i]:.3f}"
                  f"{' (fallback)' if fallback else ''} (AR's {ar_confidence(model, ids, ar, i):.3f}), "
                  f"{left} masked to its left; right: block diffusion {bd_right}, AR {ar_right}")
    keys = ("prompts", "departures", "departures by fallback", "filled before its left", "ar only",
            "ar only, by fallback")
    print("\n| task | " + " | ".join(keys) + " |\n|---|" + "---:|" * len(keys))
    for name in (*sorted(counts), "all"):
        c = sum(counts.values(), Counter()) if name == "all" else counts[name]
        print(f"| {name} | " + " | ".join(str(c[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
