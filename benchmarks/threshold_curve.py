"""Accuracy and tokens per forward of block diffusion over confidence thresholds (embedded model).

    python benchmarks/threshold_curve.py --limit 20 --png benchmarks/threshold_curve.png

Prints a markdown table; with --png also saves the curve (needs `pip install -e ".[plot]"`).
"""

import argparse

import torch

from clover import CloverMoeForCausalLM, default_model_dir
from clover.data import eval_examples
from clover.evaluation.run import decode_all

THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


def measure(model, tokenizer, examples, block_size: int, max_new_tokens: int):
    rows = []
    for threshold in THRESHOLDS:
        settings = {"max_new_tokens": max_new_tokens, "block_size": block_size, "threshold": threshold}
        s = decode_all(model, tokenizer, examples, "block_diffusion", settings)
        rows.append((threshold, s.accuracy, s.tokens_per_forward, s.tokens_per_second))
        print(f"| {threshold:.2f} | {s.accuracy:.3f} | {s.tokens_per_forward:.2f} | {s.tokens_per_second:.1f} |",
              flush=True)
    return rows


def plot(rows, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    thresholds = [r[0] for r in rows]
    fig, left = plt.subplots(figsize=(6, 3.6))
    left.plot(thresholds, [r[1] for r in rows], "o-", color="tab:blue", label="accuracy")
    left.set_xlabel("confidence threshold")
    left.set_ylabel("accuracy", color="tab:blue")
    left.set_ylim(0, 1.02)
    right = left.twinx()
    right.plot(thresholds, [r[2] for r in rows], "s--", color="tab:orange", label="tokens / forward")
    right.set_ylabel("tokens per forward", color="tab:orange")
    left.set_title("Embedded Clover model: accuracy vs parallelism")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--limit", type=int, default=20, help="prompts per task")
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--png", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    path = args.model or default_model_dir()
    model = CloverMoeForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    examples = eval_examples(args.limit, seed=0)
    print(f"model {path}, {len(examples)} prompts, block {args.block_size}, greedy\n")
    print("| threshold | accuracy | tokens/forward | tokens/s |\n|---|---|---|---|")
    with torch.inference_mode():
        rows = measure(model, tokenizer, examples, args.block_size, args.max_new_tokens)
    if args.png:
        plot(rows, args.png)
        print(f"\nsaved {args.png}")


if __name__ == "__main__":
    main()
