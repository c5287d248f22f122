"""Training losses of runs that drew the same batches in the same order (same data seed, recipe and
batch size), step by step: mean loss per window of steps for each run and each run's difference from
the first, with the share of steps in the window where it was lower. With equal batches the noise
of the data cancels, so a difference of a few hundredths shows within a few hundred steps.

    python benchmarks/paired_loss.py runs/curriculum-check runs/rotary-check --window 100 \
        [--png benchmarks/rotary_loss.png]

Prints a markdown table; with --png also plots the windows' means (needs `pip install -e ".[plot]"`).
"""

import argparse
import json
from pathlib import Path

KEY = "l_ar"  # the AR loss; `l_diff` for block-mode runs


def losses(run: Path, key: str) -> dict[int, float]:
    """Step -> loss, from RUN/metrics.jsonl (the last line of a step wins, as after a resume)."""
    rows = (json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip())
    return {row["step"]: row[key] for row in rows if key in row}


def windows(runs: list[dict[int, float]], window: int) -> list[tuple[int, int, list[float], list[float]]]:
    """(first step, last step, each run's mean loss, each run's share of steps below the first run's)
    over the steps every run has, `window` steps at a time."""
    steps = sorted(set.intersection(*(set(run) for run in runs)))
    rows = []
    for start in range(0, len(steps), window):
        chunk = steps[start:start + window]
        means = [sum(run[s] for s in chunk) / len(chunk) for run in runs]
        below = [sum(run[s] < runs[0][s] for s in chunk) / len(chunk) for run in runs]
        rows.append((chunk[0], chunk[-1], means, below))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path,
                        help="run folders (OUT of `clover train`); the first is the baseline")
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--key", default=KEY, help="metric to compare (l_ar, l_diff, loss)")
    parser.add_argument("--png", type=Path)
    args = parser.parse_args()
    if len(args.runs) < 2:
        parser.error(f"give at least two runs to compare, got {len(args.runs)}")
    curves = [losses(run, args.key) for run in args.runs]
    rows = windows(curves, args.window)
    names = [run.name for run in args.runs]
    differences = [f"{name} − {names[0]} (share lower)" for name in names[1:]]
    print("| steps | " + " | ".join(names + differences) + " |")
    print("|---|" + "---:|" * (2 * len(names) - 1))
    for first, last, means, below in rows:
        diffs = [f"{m - means[0]:+.4f} ({b:.2f})" for m, b in zip(means[1:], below[1:])]
        print(f"| {first}-{last} | " + " | ".join(f"{m:.4f}" for m in means) + " | " + " | ".join(diffs) + " |")
    if args.png:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for name, curve in zip(names, zip(*(means for _, _, means, _ in rows))):
            ax.plot([(first + last) / 2 for first, last, _, _ in rows], curve, marker="o", label=name)
        ax.set(xlabel="step", ylabel=f"{args.key}, mean over {args.window} steps", yscale="log")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
        print(f"saved {args.png}")


if __name__ == "__main__":
    main()
