"""How much each attention head writes into the residual stream, checkpoint by checkpoint: the mean
norm of its `o_proj` columns, for the old heads and for the heads a run added (`model.grow_heads`).
A new head whose columns stay small is one training never recruited.

    python benchmarks/head_writes.py runs/heads-a runs/heads-lr-a [--every 1000]

Prints a markdown table: per run and checkpoint step, per attention layer, the old heads' and the
new heads' mean column norm and their ratio. The old heads are the first `num_attention_heads` of the
run's init (`model.init` in the run's recipe.json).
"""

import argparse
import json
from pathlib import Path

from safetensors import safe_open

O_PROJ = ".self_attn.o_proj.weight"


def head_writes(shard: Path, head_dim: int) -> dict[int, list[float]]:
    """Layer index -> each head's `o_proj` column-block norm (Frobenius, over its `head_dim`
    columns), from a checkpoint shard (keys `model.model.layers.N...`)."""
    writes = {}
    with safe_open(str(shard), "pt") as tensors:
        for key in tensors.keys():
            if key.startswith("model.") and key.endswith(O_PROJ):
                weight = tensors.get_tensor(key)  # [hidden, H * D]
                per_head = weight.view(weight.shape[0], -1, head_dim).norm(dim=(0, 2))  # [H]
                writes[int(key.split(".")[3])] = per_head.tolist()
    return writes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders of `clover train` with added heads")
    parser.add_argument("--every", type=int, default=1000, help="checkpoint steps to show (multiples of it)")
    args = parser.parse_args()
    print("| run | step | layer | old heads' mean norm | new heads' mean norm | new / old |")
    print("|---|---:|---:|---:|---:|---:|")
    for run in args.runs:
        init = json.loads((run / "recipe.json").read_text())["model"].get("init")
        if not init:
            parser.error(f"{run} was trained from a fresh model, not grown from an init: it added no heads")
        config = json.loads((Path(init) / "config.json").read_text())
        head_dim, old_heads = config["head_dim"], config["num_attention_heads"]
        for folder in sorted((run / "checkpoints").glob("step-*")):
            step = int(folder.name.split("-")[1])
            if step % args.every:
                continue
            shard, = folder.glob("shard-*model*.safetensors")
            for layer, norms in sorted(head_writes(shard, head_dim).items()):
                old, new = norms[:old_heads], norms[old_heads:]
                old_mean, new_mean = sum(old) / len(old), sum(new) / max(1, len(new))
                print(f"| {run.name} | {step} | {layer} | {old_mean:.3f} | {new_mean:.3f} | {new_mean / old_mean:.3f} |")


if __name__ == "__main__":
    main()
