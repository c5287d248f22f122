"""Batch-1 decoding on the embedded model (clover-tiny, CPU): block diffusion against AR, and the
cost of one block step against one AR step. Uses only `model.generate`, so the same script
measures any revision (run it with another checkout first on PYTHONPATH for "before").

Reproduce:  OMP_NUM_THREADS=1 python benchmarks/steps.py              (about a minute)
            PYTHONPATH=/path/to/other/checkout python benchmarks/steps.py   (another revision)

Greedy, the built-in airspace prompt as a chat turn, no EOS (every mode writes `--max-new-tokens`
tokens); modes run interleaved, medians over `--repeats`. Reported per mode: ms per token, tokens
per forward, ms per forward (whole step: forward + denoise/sampling + bookkeeping), and the ratio
to AR. "step / AR step" divides ms per forward by AR's.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402


MODES = {"block diffusion": dict(), "AR": dict(mode="ar"), "self-spec": dict(mode="self_spec")}


def prompt_ids(tokenizer) -> list[int]:
    from clover.data import get_task

    text = get_task("airspace").generate(seed=7, split="eval").prompt
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         enable_thinking=False, tokenize=True, return_dict=False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--modes", default="block diffusion,AR,self-spec")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    import clover
    from clover.loading import LoadOptions, load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(clover.default_model_dir(), LoadOptions(device="cpu", dtype="fp32"))
    ids = torch.tensor([prompt_ids(tokenizer)])
    modes = [m for m in args.modes.split(",")]
    times = {m: [] for m in modes}  # per repeat: seconds of the whole generate call
    stats = {}
    for i in range(args.repeats + 1):
        for m in list(modes):
            start = time.perf_counter()
            try:
                out = model.generate(ids, max_new_tokens=args.max_new_tokens, eos_token_id=[], do_sample=False,
                                     return_dict_in_generate=True, **MODES[m])
            except (ValueError, TypeError) as e:  # a mode this revision does not have
                print(f"{m}: skipped ({e})")
                modes.remove(m)
                continue
            if i:
                times[m].append(time.perf_counter() - start)
            stats[m] = (out.new_tokens[0], out.num_forward_passes, out.sequences)
    print(f"prompt {ids.shape[1]} tokens, {args.max_new_tokens} new, {args.threads} thread(s), "
          f"median of {args.repeats} (ratios: median of the per-repeat ratios; modes interleaved)")
    print("| mode | ms / token | tokens / forward | ms / forward | step / AR step | speed vs AR |")
    print("|---|---:|---:|---:|---:|---:|")
    for m in modes:
        new, forwards, _ = stats[m]
        wall = statistics.median(times[m])
        step = statistics.median(t / forwards / (a / stats["AR"][1]) for t, a in zip(times[m], times["AR"]))
        speed = statistics.median((a / stats["AR"][0]) / (t / new) for t, a in zip(times[m], times["AR"]))
        print(f"| {m} | {1e3 * wall / new:.2f} | {new / forwards:.2f} | {1e3 * wall / forwards:.2f} | "
              f"{step:.2f} | {speed:.2f}× |")
    if "self-spec" in stats and "AR" in stats:
        same = torch.equal(stats["self-spec"][2], stats["AR"][2])
        print(f"self-spec text identical to AR: {same}")


if __name__ == "__main__":
    main()
