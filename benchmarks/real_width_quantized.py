"""INT8 / INT4 weights against bf16 at the released widths: AR decode step and 32-token block step
time (the three models in one process, steps interleaved), bytes per parameter, and the per-layer
relative output error.

Reproduce:  nice -n 19 python benchmarks/real_width_quantized.py [--repeats 5]
            CLOVER_QUANT_KERNELS=0 nice -n 19 python benchmarks/real_width_quantized.py   (the plain
            twin: dequantize, then the bf16 matmul)

The model: `CloverMoeConfig`'s defaults (the released widths, as `REAL_WIDTHS_SLICE`: hidden 2048,
256 experts top-8 of 512, GQA 16/2 of 256, GDN 16/32 heads of 128, vocab 248320) on 2 layers
(1 GDN, 1 attention) rather than the slice's 4, built in memory with random bf16 weights of std 0.02
and the router redrawn with std 2/sqrt(hidden) as in `real_width.py`, so that bf16, INT8 and INT4
fit in memory together (the quantized models share the bf16 model's float tensors). Per-layer times
are those of the slice's layers; the 40-layer figures are an extrapolation, as in `real_width.py`:
embedding + 30 x the GDN layer + 10 x the attention layer + final norm and head (bf16 in all three).
Times are CPU time of this process (medians of `--repeats` after one warm-up).
"""

import argparse
import copy
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from real_width import FULL_LAYERS, CopyProbe, UnitProbe, measure, steps  # noqa: E402

from clover.model import CloverMoeConfig, CloverMoeForCausalLM  # noqa: E402
from clover.model.quantized import KERNELS_ENV, QuantizedWeight, kernels_enabled  # noqa: E402
from clover.quantization import layer_errors, quantize_model, quantized_bytes  # noqa: E402

GROUP = 128  # the default; --group-size changes it
STEPS = ("AR decode step", "block, 32 masks, coreset", "block, 32 masks, no coreset")


def build_bf16(layer_types: list[str]) -> CloverMoeForCausalLM:
    config = CloverMoeConfig(num_hidden_layers=len(layer_types), layer_types=layer_types)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = CloverMoeForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("A_log", "dt_bias", "logit_scale", "history_bias", "history_c")) or "norm" in name:
                continue
            p.normal_(0.0, 0.02)
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 2.0 / config.hidden_size ** 0.5)
    return model


def quantized_copy(model: CloverMoeForCausalLM, bits: int, group: int) -> CloverMoeForCausalLM:
    """`model` quantized, sharing every float tensor it keeps with `model` (no second copy)."""
    shared = copy.deepcopy(model, memo={id(p): p for p in model.parameters()})
    return quantize_model(shared, bits, group)


def quantized_part(model) -> tuple[int, int]:
    """(weights, bytes) of the quantized modules (qweight, scales, zeros)."""
    weights = [m for m in model.modules() if isinstance(m, QuantizedWeight)]
    return (sum(m.qweight.numel() * (2 if m.bits == 4 else 1) for m in weights),
            sum(p.nbytes for m in weights for p in (m.qweight, m.scales, m.zeros) if p is not None))


def weight_error(bf16, quantized) -> float:
    """||W_q - W|| / ||W|| over GDN in_proj_qkv, attention q_proj and expert 0's two projections of
    the first layer of each kind (fp32)."""
    def pairs(model):
        gdn, attn = model.model.layers[0], model.model.layers[1]
        return [gdn.linear_attn.in_proj_qkv, attn.self_attn.q_proj,
                (gdn.mlp.experts.gate_up_proj, 0), (gdn.mlp.experts.down_proj, 0)]
    num = den = 0.0
    for ref, q in zip(pairs(bf16), pairs(quantized)):
        if isinstance(ref, tuple):
            w, wq = ref[0][ref[1]].float(), q[0].dequantize(torch.float32, q[1])
        else:
            w, wq = ref.weight.float(), q.dequantize(torch.float32)
        num, den = num + float((wq - w).pow(2).sum()), den + float(w.pow(2).sum())
    return (num / den) ** 0.5


def per_kind(model, result: dict) -> dict:
    """unit kind -> mean CPU ms ("embed", "head", "linear_attention", "full_attention")."""
    kinds = {"embed": ["embed"], "head": ["head"]}
    for i, layer in enumerate(model.model.layers):
        kinds.setdefault(layer.kind, []).append(f"layer {i}")
    return {kind: statistics.mean(result["units"][u][1] for u in units) for kind, units in kinds.items()}


def extrapolate(ms: dict) -> float:
    scale = {"embed": 1, "head": 1, **FULL_LAYERS}
    return sum(scale[kind] * v for kind, v in ms.items() if kind in scale)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--group-size", type=int, default=GROUP,
                        help="quantization group (512 is the largest that divides every quantized width)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    path = "torch kernels" if kernels_enabled() else f"plain twin ({KERNELS_ENV}=0)"
    with torch.inference_mode():
        bf16 = build_bf16(["linear_attention", "full_attention"])
    models = {"bf16": bf16, "int8": quantized_copy(bf16, 8, args.group_size),
              "int4": quantized_copy(bf16, 4, args.group_size)}
    ids = torch.randint(0, 200000, (1, 64), generator=torch.Generator().manual_seed(2))
    errors = {name: layer_errors(bf16, m, ids) for name, m in models.items() if name != "bf16"}
    copy_probe, results = CopyProbe(0.25), {}
    with torch.inference_mode():
        for name, model in models.items():
            probe = UnitProbe(model)
            cases = {k: v for k, v in steps(model, args.context).items() if k in STEPS}
            probe.take()
            results[name] = {k: per_kind(model, r) | {"total": r["total"][1]}
                             for k, r in measure(probe, copy_probe, cases, args.repeats, 1).items()}
    print(f"path: {path}; threads {args.threads}; context {args.context}; group {args.group_size}; CPU ms, median of "
          f"{args.repeats}\n")
    print("| step | weights | GDN layer ms | ×bf16 | attention layer ms | ×bf16 | head ms | 40 layers ms, "
          "extrapolated | ×bf16 |\n|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for step in STEPS:
        base = results["bf16"][step]
        for name in models:
            r = results[name][step]
            print(f"| {step} | {name} | {r['linear_attention']:.1f} | {r['linear_attention'] / base['linear_attention']:.2f} | "
                  f"{r['full_attention']:.1f} | {r['full_attention'] / base['full_attention']:.2f} | {r['head']:.1f} | "
                  f"{extrapolate(r):.0f} | {extrapolate(r) / extrapolate(base):.2f} |")
    print("\n| weights | bytes / quantized weight | 40-layer model GB (meta count) | weight rel. err | "
          "layer 0 (GDN) rel. err | layer 1 (attention) rel. err | logits rel. err |\n|---|---:|---:|---:|---:|---:|---:|")
    config = CloverMoeConfig()
    for name, model in models.items():
        bits = None if name == "bf16" else int(name[3:])
        weights, nbytes = quantized_part(model) if bits else (1, 2)
        errs = ([f"{weight_error(bf16, model):.4f}"] + [f"{e.relative:.4f}" for e in errors[name]] if bits
                else ["–"] * 4)
        print(f"| {name} | {nbytes / weights:.4f} | {quantized_bytes(config, bits, args.group_size) / 1e9:.2f} | "
              + " | ".join(errs) + " |")


if __name__ == "__main__":
    main()
