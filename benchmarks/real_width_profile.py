"""Where an AR decode step and a 32-mask block step spend their CPU time at the released widths:
matmul time and its GFLOP/s, against everything else, and the lower bound that puts on the block/AR
ratio of the 40-layer model.

Reproduce:  OMP_NUM_THREADS=1 python benchmarks/real_width_profile.py [--repeats 5]

The model is the slice's layout (3 GDN layers, 1 attention layer) at `CloverMoeConfig`'s default
widths, built in memory with random bf16 weights as in `real_width_quantized.py` (router peaked);
a 256-token causal prefix. One profiled call per step (torch.profiler, self CPU time per op), after
`--repeats` timed calls (median CPU time). Matmuls are `aten::mm`, `aten::bmm`, `aten::addmm` (FLOPs
from their shapes, 2*M*K*N); `F.grouped_mm`'s CPU loop over the experts is counted as "other" except
the matmuls it calls. The 40-layer figures are an extrapolation: 10 x the slice's layers + the head.

The bound: if every non-matmul cost of the block step were zero and the AR step stayed as measured,
block / AR >= (block matmul time) / (AR time). Above 3 means the issue-9 goal (block step with the
coreset <= 3x an AR step) cannot be met on this CPU by removing overhead; only fewer FLOPs or a
faster GEMM would.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from real_width import steps  # noqa: E402
from real_width_quantized import build_bf16  # noqa: E402

MATMULS = ("aten::mm", "aten::bmm", "aten::addmm")
SLICE = ["linear_attention"] * 3 + ["full_attention"]
SCALE = 10  # the released 40 layers = 10 x the slice's 4


def matmul_operands(name: str, shapes: list) -> tuple[list, list]:
    """The two factors' shapes: (a, b) of mm / bmm (an out= tensor may follow), (bias, a, b) of addmm."""
    return (shapes[1], shapes[2]) if name == "aten::addmm" else (shapes[0], shapes[1])


def matmul_flops(name: str, shapes: list) -> float:
    a, b = matmul_operands(name, shapes)
    batch = a[0] if name == "aten::bmm" else 1
    return 2.0 * batch * a[-2] * a[-1] * b[-1]


def breakdown(run, make, vocab: int) -> dict:
    """Self CPU ms of the head matmul, the layers' matmuls (and their GFLOP), and everything else."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run(make())
    out = {"head_mm": 0.0, "layer_mm": 0.0, "layer_gflop": 0.0, "head_gflop": 0.0, "other": 0.0}
    for event in prof.events():
        ms = event.self_cpu_time_total / 1e3
        if event.name in MATMULS:
            head = matmul_operands(event.name, event.input_shapes)[1][-1] == vocab
            key = "head" if head else "layer"
            out[f"{key}_mm"] += ms
            out[f"{key}_gflop"] += matmul_flops(event.name, event.input_shapes) / 1e9
        else:
            out["other"] += ms
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--context", type=int, default=256)
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model = build_bf16(SLICE)
    vocab = model.config.vocab_size
    cases = steps(model, args.context)
    rows = {}
    with torch.inference_mode():
        for name in ("AR decode step", "block, 32 masks, coreset"):
            run, make, _ = cases[name]
            times = []
            for _ in range(args.repeats + 1):
                cache = make()
                start = time.process_time()
                run(cache)
                times.append((time.process_time() - start) * 1e3)
            parts = breakdown(run, make, vocab)
            rows[name] = {"ms": statistics.median(times[1:]), **parts}
    print(f"threads {torch.get_num_threads()}; slice {SLICE}; CPU ms, median of {args.repeats}; "
          f"40 layers = {SCALE} x the slice + head (extrapolated)")
    print(f"{'step':<26} {'slice ms':>9} {'head mm ms':>11} {'head GFLOP/s':>13} {'layer mm ms':>12} "
          f"{'layer GFLOP/s':>14} {'other ms':>9} {'40-layer ms':>12} {'40-layer other ms':>18}")
    for name, r in rows.items():
        scale = r["ms"] / (r["head_mm"] + r["layer_mm"] + r["other"])  # the profiled call vs the median
        r["full_mm"] = scale * (r["head_mm"] + SCALE * r["layer_mm"])
        r["full_other"] = scale * SCALE * r["other"]
        r["full"] = r["full_mm"] + r["full_other"]
        print(f"{name:<26} {r['ms']:>9.1f} {r['head_mm']:>11.1f} {gflops(r, 'head'):>13.0f} "
              f"{r['layer_mm']:>12.1f} {gflops(r, 'layer'):>14.0f} {r['other']:>9.1f} {r['full']:>12.0f} "
              f"{r['full_other']:>18.0f}")
    ar, block = rows["AR decode step"], rows["block, 32 masks, coreset"]
    floor = (block["full_mm"] + ar["full_other"]) / ar["full"]
    peak = gflops(block, "head")
    at_peak = (block["full_mm"] * (1 - SCALE * block["layer_mm"] / (block["head_mm"] + SCALE * block["layer_mm"]))
               + SCALE * block["layer_gflop"] / peak * 1e3 + ar["full_other"]) / ar["full"]
    print(f"block / AR, 40 layers: {block['full'] / ar['full']:.2f} as measured; "
          f"{floor:.2f} with the block step's non-matmul time cut to the AR step's; "
          f"{at_peak:.2f} with that and the layers' matmuls at the head's {peak:.0f} GFLOP/s (goal <= 3)")


def gflops(r: dict, part: str) -> float:
    return r[f"{part}_gflop"] / max(r[f"{part}_mm"], 1e-9) * 1e3


if __name__ == "__main__":
    main()
