"""Weight-only INT8 / INT4 against fp32: per-layer relative error, weight bytes, exact-match accuracy
on the embedded model, and forward speed on a small random config (CPU, fp32: the plain dequantize
twin; bf16 models run torch's packed kernels, measured by `benchmarks/real_width_quantized.py`).

Reproduce: `python benchmarks/quantization.py [--limit 10] [--write]` (--write updates BENCHMARKS.md,
keeping the section's `### Real widths` part, which `benchmarks/real_width_quantized.py` measures).
"""

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import write_section  # noqa: E402

EMBEDDED_GROUP = 64  # divides every quantized width of clover-tiny (192, 64); 128 does not
SMALL = dict(vocab_size=8192, hidden_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             head_dim=128, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64,
             linear_value_head_dim=64, num_experts=32, num_experts_per_tok=4, moe_intermediate_size=256,
             shared_expert_intermediate_size=256, mask_token_id=8191, max_position_embeddings=4096)


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def embedded_rows(limit: int) -> list[str]:
    from clover import default_model_dir
    from clover.data import eval_examples
    from clover.data.corpus import format_chat
    from clover.evaluation.run import evaluate
    from clover.loading import LoadOptions, load_model_and_tokenizer
    from clover.quantization import layer_errors, quantize_model

    fp32, tokenizer = load_model_and_tokenizer(default_model_dir(), LoadOptions(device="cpu", dtype="fp32"))
    examples = eval_examples(limit, seed=0)
    ids = tokenizer(format_chat(tokenizer, examples[0])[0], return_tensors="pt").input_ids
    rows = ["| weights | bytes | bytes/param (quantized part) | logits rel. err | max layer rel. err | "
            "accuracy | tokens/forward |", "|---|---:|---:|---:|---:|---:|---:|"]
    base = weight_bytes(fp32)
    accuracy = {}
    for bits in (None, 8, 4):
        model = fp32 if bits is None else quantize_model(copy.deepcopy(fp32), bits, EMBEDDED_GROUP)
        errors = layer_errors(fp32, model, ids) if bits else []
        report = evaluate(model, tokenizer, examples, with_ar=False, show_progress=False)
        name = "fp32" if bits is None else f"int{bits}, group {EMBEDDED_GROUP}"
        per_param = "4" if bits is None else f"{(bits + 32 * (2 if bits == 4 else 1) / EMBEDDED_GROUP) / 8:.3f}"
        err = f"{errors[-1].relative:.4f}" if errors else "–"
        worst = f"{max(e.relative for e in errors[:-1]):.4f}" if errors else "–"
        d = report.diffusion
        rows.append(f"| {name} | {weight_bytes(model) / 1e6:.2f} MB ({weight_bytes(model) / base:.2f}×) | "
                    f"{per_param} | {err} | {worst} | {d.accuracy:.3f} ({d.correct}/{d.n}) | "
                    f"{d.new_tokens / max(d.forwards, 1):.2f} |")
        print(rows[-1], flush=True)
        accuracy[bits] = d.accuracy
    drops = ", ".join(f"INT{bits} {100 * (accuracy[None] - accuracy[bits]):+.1f}" for bits in (8, 4))
    return rows + ["", f"Drop in accuracy, fp32 minus quantized, in points (issue 9's bounds: INT8 ≤ 1, INT4 ≤ 3;"
                       f" negative: the quantized model scored higher): {drops} (held-out prompts of seed 0,"
                       f" the chat template's default thinking mode)."]


def median_ms(fn, runs: int = 7, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


@torch.inference_mode()
def speed_rows() -> list[str]:
    from clover.model import CloverMoeConfig, CloverMoeForCausalLM
    from clover.model.cache import CloverCache
    from clover.quantization import layer_errors, quantize_model

    torch.manual_seed(0)
    fp32 = CloverMoeForCausalLM(CloverMoeConfig(**SMALL)).eval()
    prefix = torch.randint(0, 8000, (1, 128))
    rows = ["| weights | MB | decode step ms | ×fp32 | 32-token block step ms | ×fp32 | logits rel. err |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    base = {}
    for bits in (None, 8, 4):
        model = fp32 if bits is None else quantize_model(copy.deepcopy(fp32), bits, 128)
        cache = CloverCache(model.config.layer_types)
        model(prefix, past_key_values=cache)
        token, block = prefix[:, :1], torch.full((1, 32), SMALL["mask_token_id"])
        decode = median_ms(lambda: model(token, past_key_values=copy.deepcopy(cache)))
        block_ms = median_ms(lambda: model(block, past_key_values=cache, block_len=32))
        base.setdefault("decode", decode)
        base.setdefault("block", block_ms)
        err = f"{layer_errors(fp32, model, prefix[:, :64])[-1].relative:.4f}" if bits else "–"
        rows.append(f"| {'fp32' if bits is None else f'int{bits}, group 128'} | {weight_bytes(model) / 1e6:.1f} | "
                    f"{decode:.1f} | {decode / base['decode']:.2f} | {block_ms:.1f} | {block_ms / base['block']:.2f} | {err} |")
        print(rows[-1], flush=True)
    return rows


def real_width_part(path: Path) -> list[str]:
    """The section's `### Real widths` lines as they stand (benchmarks/real_width_quantized.py's)."""
    text = path.read_text() if path.exists() else ""
    start = text.find("\n### Real widths", text.find("\n## Quantization (INT8 / INT4 weights)"))
    if start < 0:
        return []
    end = text.find("\n## ", start)
    return [""] + text[start + 1:None if end < 0 else end].rstrip("\n").splitlines()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--limit", type=int, default=10, help="eval prompts per task on the embedded model")
    parser.add_argument("--write", action="store_true", help="update the section of BENCHMARKS.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    embedded = embedded_rows(args.limit)
    speed = speed_rows()
    if args.write:
        lines = [
            "Weight-only, group-wise (`clover quantize SRC DST --bits {8,4}`; `clover.quantization.quantize_model`"
            " in memory). Quantized: routed experts, shared expert, attention q/k/v/o, GDN in_proj_qkv /"
            " in_proj_z / out_proj; float: embeddings, lm_head, norms, router, shared-expert gate, GDN"
            " in_proj_a/b, conv, bd_gdn scalars. INT8 symmetric, INT4 min-max with zero point (torch's"
            " int4pack convention). A bf16 model on CPU runs torch's own kernels (the kernel section of `clover/model/quantized.py`):"
            " INT4 `_weight_int4pack_mm_for_cpu`, INT8 `_weight_int8pack_mm` once per group of columns (up to"
            " 4 rows per call); the weights are laid out for them once, at quantize or load time, and"
            " `state_dict` still writes the stored format. The plain twin (dequantize, then the float matmul)"
            " serves everything else: fp32 models (the kernels are 15-30× slower in fp32; the tables below"
            " are fp32, so they measure the twin), CUDA, shapes the kernels refuse, and `CLOVER_QUANT_KERNELS=0`."
            " torchao is not used: on CPU its int4 weight-only layout calls the same int4pack kernels and its int8"
            " weight-only path dequantizes, so it would add a dependency without a faster kernel.",
            "",
            "**CUDA (untested here, no GPU):** the twin runs there — dequantize to bf16, then the cuBLAS matmul;"
            " nothing is packed off the CPU, and a CPU-packed model moved to CUDA unpacks each weight on its first"
            " call. torch's CUDA int4 kernel (`_weight_int4pack_mm`, same scales-and-zeros convention) is not wired in.",
            "",
            f"Reproduce: `python benchmarks/quantization.py --limit {args.limit} --write` (CPU, fp32 activations,"
            f" threads: {torch.get_num_threads()}, on the shared 2-core dev box).",
            "",
            f"### Embedded model (clover-tiny, greedy block diffusion, {3 * args.limit} held-out prompts)",
            "",
            *embedded,
            "",
            "Relative errors: ||y_q − y_fp32|| / ||y_fp32|| on one eval prompt (decoder-layer outputs, each model"
            " on its own inputs, so errors accumulate). Bytes/param counts scales (and INT4 zeros) as fp32.",
            "",
            "### Speed and size, small random config (hidden 512, 4 layers, 32 experts top-4, vocab 8k)",
            "",
            *speed,
            "",
            "Decode step: 1 token after a 128-token prefix; block step: 32 masks on the same cache; median of 7.",
            "",
            "Reading: the small config has default-init random weights and an untrained router, so small"
            " weight errors flip expert choices: its logit errors overstate what a trained model sees (compare"
            " the embedded model).",
        ]
        path = Path(__file__).parents[1] / "BENCHMARKS.md"
        write_section(path, "Quantization (INT8 / INT4 weights)", lines + real_width_part(path))


if __name__ == "__main__":
    main()
