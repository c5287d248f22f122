"""How much each unit a run grew writes into the residual stream, checkpoint by checkpoint, against
the init's own units: attention heads (the norm of a head's block of `o_proj` columns) and expert
hidden units (the norm of a unit's column of a routed expert's or the shared expert's down
projection). A new unit whose columns stay small is one training never recruited.

    python benchmarks/grown_writes.py runs/heads-a runs/experts-a [--every 1000]

Prints a markdown table: per run, checkpoint step, attention or MoE layer and kind of unit that the
run grew (`model.grow_heads`, `grow_experts`, `grow_shared_expert`), the old units' and the new
units' mean norm and their ratio. The old units are the first of each kind, as many as the run's
init has (`model.init` in the run's recipe.json).
"""

import argparse
import json
from pathlib import Path

import torch
from safetensors import safe_open


def head_norms(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    """`o_proj` [hidden, H * D] -> each head's column-block norm [H]."""
    return weight.view(weight.shape[0], -1, head_dim).norm(dim=(0, 2))


# Kind of unit -> (the key suffix of its residual write, the init config's count of such units, the
# write's per-unit norms with the units on the last dim).
KINDS = {
    "heads": (".self_attn.o_proj.weight", "num_attention_heads", head_norms),
    "expert units": (".mlp.experts.down_proj", "moe_intermediate_size",
                     lambda weight, _: weight.norm(dim=1)),  # [E, H, I] -> [E, I]
    "shared units": (".mlp.shared_expert.down_proj.weight", "shared_expert_intermediate_size",
                     lambda weight, _: weight.norm(dim=0)),  # [H, I] -> [I]
}


def unit_writes(shard: Path, head_dim: int) -> dict[tuple[str, int], torch.Tensor]:
    """(kind, layer index) -> each unit's write norm, units on the last dim, from a checkpoint shard
    (keys `model.model.layers.N...`)."""
    writes = {}
    with safe_open(str(shard), "pt") as tensors:
        for key in tensors.keys():
            for kind, (suffix, _, norms) in KINDS.items():
                if key.startswith("model.") and key.endswith(suffix):
                    writes[kind, int(key.split(".")[3])] = norms(tensors.get_tensor(key), head_dim)
    return writes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders of `clover train` that grew heads or units")
    parser.add_argument("--every", type=int, default=1000, help="checkpoint steps to show (multiples of it)")
    args = parser.parse_args()
    print("| run | step | layer | unit | old units' mean norm | new units' mean norm | new / old |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for run in args.runs:
        init = json.loads((run / "recipe.json").read_text())["model"].get("init")
        if not init:
            parser.error(f"{run} was trained from a fresh model, not grown from an init: it added no units")
        config = json.loads((Path(init) / "config.json").read_text())
        for folder in sorted((run / "checkpoints").glob("step-*")):
            step = int(folder.name.split("-")[1])
            if step % args.every:
                continue
            shard, = folder.glob("shard-*model*.safetensors")
            for (kind, layer), norms in sorted(unit_writes(shard, config["head_dim"]).items(), key=lambda x: x[0][::-1]):
                old_count = config[KINDS[kind][1]]
                old, new = norms[..., :old_count], norms[..., old_count:]
                if new.numel():
                    ratio = new.mean() / old.mean()
                    print(f"| {run.name} | {step} | {layer} | {kind} | {old.mean():.3f} | {new.mean():.3f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
