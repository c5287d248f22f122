"""Accuracy against tokens per forward of block diffusion over confidence thresholds, one curve per
rule: SPEC §4's (every masked position above the threshold, else the most confident one), the causal
fallback (`clover.model.generation_causal_fallback`: where no position passes, the causal mode's
tokens) and the prefix fill with the causal fallback (only positions whose block positions to the
left are filled), with the AR point of the same checkpoint (embedded model by default). At threshold
1.0 every step is a fallback, so the causal curves end on the AR point.

    python benchmarks/threshold_curve.py --limit 20 --png benchmarks/threshold_curve.png

Prints a markdown table; with --png also saves the curve (needs `pip install -e ".[plot]"`).
"""

import sys
from pathlib import Path

import torch

from clover.data import eval_examples
from clover.evaluation.run import decode_all

sys.path.insert(0, str(Path(__file__).parent))
from common import embedded_probe_parser, load_probe_model  # noqa: E402

THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
# (fill, fallback) of each curve, its colour and where its threshold labels go (points above the curve)
RULES = {("threshold", "confidence"): ("tab:blue", -12), ("threshold", "causal"): ("tab:green", 8),
         ("prefix", "causal"): ("tab:purple", 16)}


def measure(model, tokenizer, examples, block_size: int, max_new_tokens: int):
    """Rows ((fill, fallback) or "AR", threshold or None, accuracy, tokens per forward, tokens/s)."""
    rows = []
    runs = [(rule, threshold) for rule in RULES for threshold in THRESHOLDS] + [("AR", None)]
    for rule, threshold in runs:
        if rule == "AR":
            modes = {"ar": {"max_new_tokens": max_new_tokens}}
        else:
            fill, fallback = rule
            modes = {"block_diffusion": {"max_new_tokens": max_new_tokens, "block_size": block_size,
                                         "threshold": threshold, "fill": fill, "fallback": fallback}}
        (s,) = decode_all(model, tokenizer, examples, modes).values()
        rows.append((rule, threshold, s.accuracy, s.tokens_per_forward, s.tokens_per_second))
        name = "AR | " if rule == "AR" else f"{rule[0]} | {rule[1]} | {threshold:.2f}"
        print(f"| {name} | {s.accuracy:.3f} | {s.tokens_per_forward:.2f} | {s.tokens_per_second:.1f} |",
              flush=True)
    return rows


def plot(rows, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for (fill, fallback), (color, offset) in RULES.items():
        curve = [r for r in rows if r[0] == (fill, fallback)]
        ax.plot([r[3] for r in curve], [r[2] for r in curve], "o-", color=color,
                label=f"block diffusion, {fill} fill, {fallback} fallback")
        for _, threshold, acc, tpf, _ in curve:  # labels below the first curve, above the second
            ax.annotate(f"{threshold:g}", (tpf, acc), textcoords="offset points", xytext=(0, offset),
                        fontsize=7, ha="center", color=color)
    for _, _, acc, tpf, _ in (r for r in rows if r[0] == "AR"):
        ax.plot([tpf], [acc], "*", color="tab:red", markersize=12, label="AR decoding")
        ax.axhline(acc, color="tab:red", linestyle="--", linewidth=0.8, alpha=0.5)  # AR's accuracy
    ax.set_xlabel("tokens per forward")
    ax.set_ylabel("exact-match accuracy")
    low = min(r[2] for r in rows)
    ax.set_ylim(max(0.0, low - 0.1), 1.02)  # the curves' range, not the empty band below them
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title("Accuracy vs tokens per forward (point labels: threshold)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = embedded_probe_parser(__doc__, limit=20, seed=0)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--png", default=None)
    args = parser.parse_args()
    path, model, tokenizer = load_probe_model(args)
    examples = eval_examples(args.limit, seed=args.seed)
    print(f"model {path}, {len(examples)} prompts, block {args.block_size}, greedy, "
          f"{torch.get_num_threads()} thread(s)\n")
    print("| fill | fallback | threshold | accuracy | tokens/forward | tokens/s |\n|---|---|---|---|---|---|")
    with torch.inference_mode():
        rows = measure(model, tokenizer, examples, args.block_size, args.max_new_tokens)
    if args.png:
        plot(rows, args.png)
        print(f"\nsaved {args.png}")


if __name__ == "__main__":
    main()
