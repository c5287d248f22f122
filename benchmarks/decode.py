"""Decoding throughput: block diffusion at thresholds 0.9 / 0.95 / 1.0 against AR, same prompts.

Reproduce:  python benchmarks/decode.py                      (CPU, fp32, 1 thread, a few minutes)
            python benchmarks/decode.py --write BENCHMARKS.md (also rewrites the "Decoding" section)

The model is a mid-size random Clover (hidden 1024, 8 layers of 3 GDN + 1 attention, 64 experts
top-8, vocab 32k) whose lm_head is scaled up (`--head-scale`) so that distributions are peaked and
several positions clear the threshold per step; a random model has no real notion of confidence,
so tokens per forward here measure the machinery, not a trained model. No EOS: every run writes
`--max-new-tokens` tokens. SPEC §2 controls are on (presence 0.9, repetition 1.05, ...).

Reported per mode: tokens per forward (prefill included), tokens/s (wall clock of `generate`),
the ratio to AR tokens/s, and the share of wall time spent outside the model forward (sampling,
controls, bookkeeping, host syncs; goal < 10%).
"""

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import MID_CONFIG, mid_model, write_section  # noqa: E402

CONFIG = dict(MID_CONFIG, max_position_embeddings=8192)
MODES = [("block diffusion", 0.9), ("block diffusion", 0.95), ("block diffusion", 1.0), ("AR", None)]


class ForwardTimer:
    """Wall time inside `model(...)` calls, via forward hooks (CUDA: synchronised)."""

    def __init__(self, model):
        self.seconds, self._start = 0.0, 0.0
        self.cuda = next(model.parameters()).is_cuda
        model.register_forward_pre_hook(self._before)
        model.register_forward_hook(self._after)

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def _before(self, *args):
        self._sync()
        self._start = time.perf_counter()

    def _after(self, *args):
        self._sync()
        self.seconds += time.perf_counter() - self._start


def run_mode(model, timer, prompts, threshold, args) -> dict:
    settings = dict(max_new_tokens=args.max_new_tokens, eos_token_id=[], do_sample=False)
    if threshold is None:
        settings["mode"] = "ar"
    else:
        settings.update(threshold=threshold, block_size=args.block_size)
    tokens = forwards = 0
    wall = inside = 0.0
    for ids in prompts:
        timer.seconds = 0.0
        start = time.perf_counter()
        out = model.generate(ids, return_dict_in_generate=True, **settings)
        if timer.cuda:
            torch.cuda.synchronize()
        wall += time.perf_counter() - start
        inside += timer.seconds
        tokens += out.rows[0].new_tokens
        forwards += out.num_forward_passes
    return dict(tokens=tokens, forwards=forwards, tokens_per_forward=tokens / forwards,
                tokens_per_second=tokens / wall, outside=(wall - inside) / wall)


def table(results: list[tuple[str, float | None, dict]]) -> list[str]:
    ar = next(r for name, _, r in results if name == "AR")["tokens_per_second"]
    lines = ["| mode | threshold | tokens | forwards | tokens/forward | tokens/s | × AR | outside forward |",
             "|---|---|---|---|---|---|---|---|"]
    for name, threshold, r in results:
        shown = "—" if threshold is None else threshold
        lines.append(f"| {name} | {shown} | {r['tokens']} | {r['forwards']} | "
                     f"{r['tokens_per_forward']:.2f} | {r['tokens_per_second']:.1f} | "
                     f"{r['tokens_per_second'] / ar:.2f} | {100 * r['outside']:.1f}% |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--head-scale", type=float, default=40.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--write", type=Path, default=None, help="rewrite the Decoding section of this file")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    model = mid_model(CONFIG, dtype, args.device, head_scale=args.head_scale)
    timer = ForwardTimer(model)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 31000, (1, args.prompt_len), generator=gen).to(args.device)
               for _ in range(args.prompts)]
    model.generate(prompts[0], max_new_tokens=8, block_size=args.block_size)  # warm-up
    results = []
    for name, threshold in MODES:
        results.append((name, threshold, run_mode(model, timer, prompts, threshold, args)))
        print(f"{name} {threshold}: {results[-1][2]}", flush=True)
    setup = (f"{args.device} ({platform.processor() or platform.machine()}), {args.dtype}, "
             f"{args.threads} thread(s); mid-size random Clover (hidden 1024, 8 layers, 64 experts top-8, "
             f"vocab 32k), lm_head × {args.head_scale:g}; {args.prompts} prompts of {args.prompt_len} "
             f"tokens, {args.max_new_tokens} new tokens each (no EOS), block {args.block_size}, greedy, "
             f"SPEC §2 controls; batch 1.")
    lines = [f"Setup: {setup}", "", f"Reproduce: `python benchmarks/decode.py --prompts {args.prompts} "
             f"--prompt-len {args.prompt_len} --max-new-tokens {args.max_new_tokens} --head-scale "
             f"{args.head_scale:g} --threads {args.threads} --dtype {args.dtype}`", ""] + table(results)
    print("\n".join(lines))
    if args.write is not None:
        write_section(args.write, "Decoding", lines)


if __name__ == "__main__":
    main()
