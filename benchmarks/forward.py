"""Forward latency on CPU: Clover's causal decode step, block steps with and without the MoE coreset,
a prefill, and transformers' `Qwen3_5MoeForCausalLM` on the same weights.

Reproduce:  python benchmarks/forward.py            (fp32 and bf16, 2 threads, a few minutes)
            python benchmarks/forward.py --dtypes fp32 --repeats 5

The model is a mid-size random Clover (hidden 1024, 8 layers of 3 GDN + 1 attention, 64 experts
top-8, vocab 32k). The router weights get std 2/sqrt(hidden) (router logits of std ~2, a peaked
distribution as in trained routers; the default init gives near-uniform routing that no real
checkpoint has). Block steps run after a 256-token cached prefix: the first denoising step of a
block (32 mask tokens, whose routing is alike) and a half-denoised block (16 random tokens, 16
masks, routing spread wider). Reported: median of `--repeats` runs after warm-up (prefill:
repeats//2+1); ours and transformers' runs alternate, so a change in machine load hits both alike.
OpenMP threads wait passively (set before torch loads): on a shared machine spinning threads make
2-thread timings 10x noisier. transformers runs its defaults (sdpa attention, `grouped_mm` experts,
its PyTorch fallbacks for the conv and the chunked delta rule).
"""

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from transformers import DynamicCache, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import MID_CONFIG, mid_model  # noqa: E402

from clover.model import CloverMoeForCausalLM  # noqa: E402

CONFIG = dict(MID_CONFIG, max_position_embeddings=4096)
CONTEXT, BLOCK, PREFILL = 256, 32, 512
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def reference_model(model: CloverMoeForCausalLM) -> Qwen3_5MoeForCausalLM:
    """transformers' model sharing our tensors (assign=True: no copy of the weights)."""
    config = Qwen3_5MoeTextConfig(**{k: v for k, v in CONFIG.items() if k != "mask_token_id"},
                                  rope_parameters=dict(model.config.rope_parameters))
    reference = Qwen3_5MoeForCausalLM(config).eval()
    state = {k: v for k, v in model.state_dict().items()
             if not k.endswith(("conv_right_weight", "logit_scale", "history_bias", "history_c"))}
    reference.load_state_dict(state, strict=True, assign=True)
    return reference


def median_ms(cases: dict, runs: int, warmup: int) -> dict:
    """cases: name -> (step, make_arg). Runs alternate between the cases; `make_arg()` (a fresh cache,
    say) is built outside the timed region. Returns name -> median milliseconds after warm-up."""
    times = {name: [] for name in cases}
    for i in range(warmup + runs):
        for name, (step, make_arg) in cases.items():
            arg = make_arg()
            start = time.perf_counter()
            step(arg)
            if i >= warmup:
                times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def bench_dtype(name: str, repeats: int, warmup: int) -> dict:
    dtype = DTYPES[name]
    model = mid_model(CONFIG, dtype)
    reference = reference_model(model)
    gen = torch.Generator().manual_seed(1)
    context = torch.randint(0, 31000, (1, CONTEXT), generator=gen)
    next_token = torch.randint(0, 31000, (1, 1), generator=gen)
    prompt = torch.randint(0, 31000, (1, PREFILL), generator=gen)
    masks = torch.full((1, BLOCK), CONFIG["mask_token_id"])
    half = masks.clone()
    half[:, ::2] = torch.randint(0, 31000, (1, BLOCK // 2), generator=gen)
    blocks = {"block": (masks, False), "block+coreset": (masks, True),
              "half block": (half, False), "half block+coreset": (half, True)}

    with torch.inference_mode():
        cache = model.new_cache()
        check = model(context, past_key_values=cache, logits_to_keep=1).logits
        ref_cache = DynamicCache(config=reference.config)
        ref_check = reference(context, past_key_values=ref_cache, use_cache=True, logits_to_keep=1).logits
        experts = {label: model(ids, past_key_values=cache, block_len=BLOCK, use_coreset=flag)
                   .distinct_experts.float().mean().item() for label, (ids, flag) in blocks.items()}

        def block_step(ids, flag):  # block steps only read the cache
            return (lambda c: model(ids, past_key_values=c, block_len=BLOCK, use_coreset=flag)), lambda: cache

        steps = median_ms({
            # a decode step appends to the cache: each run gets its own copy of the 256-token cache
            "decode": (lambda c: model(next_token, past_key_values=c), cache.snapshot),
            "hf decode": (lambda c: reference(next_token, past_key_values=c, use_cache=True),
                          lambda: copy.deepcopy(ref_cache)),
            **{label: block_step(ids, flag) for label, (ids, flag) in blocks.items()},
        }, repeats, warmup)
        prefills = median_ms({
            "prefill": (lambda c: model(prompt, past_key_values=c, logits_to_keep=1), model.new_cache),
            "hf prefill": (lambda c: reference(prompt, past_key_values=c, use_cache=True, logits_to_keep=1),
                           lambda: DynamicCache(config=reference.config)),
        }, max(3, repeats // 2 + 1), 1)
    return dict(ms={**steps, **prefills}, experts=experts,
                max_diff=(check - ref_check).abs().max().item())


def report(name: str, r: dict) -> str:
    ms, e = r["ms"], r["experts"]
    return "\n".join([
        f"### {name}  (threads={torch.get_num_threads()})",
        "",
        "| pass | ours ms | transformers ms | ours / transformers | / our decode step | distinct experts / layer |",
        "|---|---:|---:|---:|---:|---:|",
        f"| decode, 1 token, {CONTEXT} cached | {ms['decode']:.1f} | {ms['hf decode']:.1f} | "
        f"{ms['decode'] / ms['hf decode']:.2f} | 1.00 | {CONFIG['num_experts_per_tok']} |",
        *(f"| block step, {BLOCK} {what}, {'coreset top_p 0.9' if cs else 'no coreset'} | "
          f"{ms[label]:.1f} | – | – | {ms[label] / ms['decode']:.2f} | {e[label]:.1f} |"
          for label, what, cs in (("block", "masks", False), ("block+coreset", "masks", True),
                                  ("half block", "half-denoised", False),
                                  ("half block+coreset", "half-denoised", True))),
        f"| prefill, {PREFILL} tokens | {ms['prefill']:.1f} | {ms['hf prefill']:.1f} | "
        f"{ms['prefill'] / ms['hf prefill']:.2f} | {ms['prefill'] / ms['decode']:.1f} | – |",
        "",
        f"max |ours - transformers| on the {CONTEXT}-token prefill's last logits: {r['max_diff']:.2e}",
    ])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    for name in args.dtypes:
        print(report(name, bench_dtype(name, args.repeats, args.warmup)), "\n", flush=True)
    print(f"total {time.perf_counter() - start:.0f} s; torch {torch.__version__}")


if __name__ == "__main__":
    main()
