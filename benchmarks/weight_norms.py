"""The weight norms that weight decay acts on, by part of the model, for checkpoints of one architecture.

AdamW decays every matrix (`clover.training.optim.build_optimizer`: parameters of two or more
dimensions); this prints the Frobenius norm of those matrices in each part (embedding, full
attention, Gated DeltaNet, routed experts, router and shared expert) and in all, and each figure as a
ratio to the first model's, so that runs at different decays can be compared with their start.

    python benchmarks/weight_norms.py clover/assets/clover-tiny runs/decay-a/final runs/decay-b/final

A trainer checkpoint (`OUT/checkpoints/step-N`) is read in the embedded model's architecture.
"""

import argparse
import sys
from pathlib import Path

import torch

from clover.model.attention import GatedAttention
from clover.model.gated_delta_net import GatedDeltaNet
from clover.model.moe import Experts, SparseMoeBlock

sys.path.insert(0, str(Path(__file__).parent))
from common import model_or_trainer_checkpoint  # noqa: E402

# a parameter's part is that of the first of these module kinds it sits in (the MoE block after its
# experts: its router and shared expert); the embedding, tied to the output head, is the rest
PARTS = ((GatedAttention, "attention"), (GatedDeltaNet, "deltanet"), (Experts, "experts"),
         (SparseMoeBlock, "router+shared"))


def parts(model: torch.nn.Module) -> dict[str, list[torch.nn.Parameter]]:
    """The decayed parameters (matrices) of each part; ``"embedding"`` holds those no part claims."""
    claimed: dict[int, str] = {}
    for kind, part in PARTS:
        for module in model.modules():
            if isinstance(module, kind):
                for p in module.parameters():
                    claimed.setdefault(id(p), part)
    grouped: dict[str, list[torch.nn.Parameter]] = {}
    for p in model.parameters():
        if p.ndim >= 2:
            grouped.setdefault(claimed.get(id(p), "embedding"), []).append(p)
    return grouped


def matrix_norms(model: torch.nn.Module) -> dict[str, float]:
    """Frobenius norm of the decayed parameters in each part, and over all of them (``"all"``)."""
    squares = {part: sum(p.detach().double().pow(2).sum().item() for p in ps) for part, ps in parts(model).items()}
    squares["all"] = sum(squares.values())
    return {part: s ** 0.5 for part, s in squares.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="checkpoint directories or trainer checkpoints; the first is the base")
    args = parser.parse_args(argv)
    rows = [(path, matrix_norms(model_or_trainer_checkpoint(path)[0])) for path in args.models]
    parts = list(rows[0][1])
    print("| model | " + " | ".join(parts) + " |")
    print("|---|" + "---:|" * len(parts))
    base = rows[0][1]
    for path, norms in rows:
        cells = [f"{norms[p]:.1f}" + ("" if norms is base else f" ({norms[p] / base[p]:.2f})") for p in parts]
        print(f"| {path} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
