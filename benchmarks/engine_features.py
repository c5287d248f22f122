"""Prefix cache and step token budget on the serving engine (embedded model, CPU, in process).

Reproduce:  OMP_NUM_THREADS=1 python benchmarks/engine_features.py [--system 2048 --long 8192]
            ... --random-model   (a small random Clover with a peaked head instead of the embedded model)

* Prefix cache: time to first block of a request sharing a `--system`-token prefix with an earlier
  one, against the same request on a cold cache (ratio; goal <= 0.3): chat prompts (a system
  message of held-out notices, then a held-out question) and random tokens.
* Head-of-line: latency of 8-token requests submitted while a `--long`-token prompt prefills,
  against the same requests on an idle engine: the defaults, then without the prefill share, with a
  128-token budget, and without any budget (pieces of 4096: the engine before the budget).
"""

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from common import embedded_engine_inputs, random_checkpoint  # noqa: E402


def make_engine(model, tok, **scheduler):
    from clover.serving.engine import Engine, EngineConfig
    from clover.serving.scheduler import SchedulerConfig

    mb = scheduler.pop("prefix_cache_mb", 256.0)
    return Engine(model, tok, EngineConfig(SchedulerConfig(**scheduler), prefix_cache_mb=mb))


def drive(engine, requests, cfg, submit_at=None):
    """Submit (id, ids) requests (request i at engine step submit_at[i]); step until idle.
    Returns id -> (seconds to first block, seconds to finish, seconds to the end of its prompt:
    the forward that finishes the prefill and takes the first block's first denoising step)."""
    from clover.serving.scheduler import EngineRequest

    submit_at = submit_at or [0] * len(requests)
    first, done, start, prompt_done = {}, {}, {}, {}

    def sink(rid):
        def put(out):
            now = time.perf_counter()
            if out.new_token_ids and rid not in first:
                first[rid] = now - start[rid]
            if out.finished:
                done[rid] = now - start[rid]
        return put
    step = 0
    with torch.inference_mode():
        while True:
            for (rid, ids), at in zip(requests, submit_at):
                if at == step:
                    start[rid] = time.perf_counter()
                    engine.submit(EngineRequest(rid, ids, cfg), sink(rid))
            if not (engine.scheduler.num_running or engine.scheduler.num_waiting) and step > max(submit_at):
                break
            engine.step()
            step += 1
            for seq in engine.scheduler.running:
                if not seq.in_prompt and seq.request_id not in prompt_done:
                    prompt_done[seq.request_id] = time.perf_counter() - start[seq.request_id]
    return {rid: (first.get(rid, done[rid]), done[rid], prompt_done.get(rid, first.get(rid, done[rid])))
            for rid, _ in requests}


def chat_prompts(tok, system_tokens: int) -> tuple[list[int], list[int]]:
    """Two chat prompts sharing a system message of about `system_tokens` tokens (held-out airspace
    notices as reference text), each asking a different held-out airspace question."""
    from clover.data.tasks import get_task

    task = get_task("airspace")
    notices, seed = [], 1000
    while len(tok.encode("\n\n".join(notices))) < system_tokens:
        notices.append(task.generate(seed, "eval").prompt)
        seed += 1
    system = "Reference notices for today:\n\n" + "\n\n".join(notices)

    def ask(seed):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": task.generate(seed, "eval").prompt}]
        return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return ask(1), ask(2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", type=int, default=2048)
    p.add_argument("--long", type=int, default=8192)
    p.add_argument("--short", type=int, default=8, help="short requests during the long prefill")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--settings", type=int, default=5, help="run the first N head-of-line settings")
    p.add_argument("--prefill-share", type=float, default=None,
                   help="the share in the settings that have one (default: SchedulerConfig's)")
    p.add_argument("--random-model", action="store_true",
                   help="a small random Clover with a peaked head (its blocks fill in a step or two) instead "
                        "of the embedded model, whose first block at a 2K-token context takes ~30 steps")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = None
        if args.random_model:
            model_dir = random_checkpoint(Path(tmp) / "random", 60.0, max_position_embeddings=args.long + 4096)
        model, tok, cfg = embedded_engine_inputs(32, model_dir)
    g = torch.Generator().manual_seed(0)
    words = lambda n: torch.randint(10, model.config.vocab_size - 10, (n,), generator=g).tolist()  # noqa: E731
    words_ok = lambda ids: [t if t != model.config.mask_token_id else t + 1 for t in ids]  # noqa: E731
    system = words_ok(words(args.system))

    # prefix cache: cold vs warm time to first block, same engine settings
    for name, (first, second) in [("chat", chat_prompts(tok, args.system)),
                                  ("random tokens", (system + words_ok(words(16)), system + words_ok(words(16))))]:
        cold = drive(make_engine(model, tok, prefix_cache_mb=0), [("q", second)], cfg)["q"]
        warm_engine = make_engine(model, tok)
        drive(warm_engine, [("a", first)], cfg)
        warm = drive(warm_engine, [("q", second)], cfg)["q"]
        hit = warm_engine.metrics.value("clover_prefix_cache_hit_tokens_total")
        print(f"prefix cache, {name}: {len(second)}-token prompt ({hit:.0f} tokens from the cache): first block "
              f"cold {1e3 * cold[0]:.0f} ms, warm {1e3 * warm[0]:.0f} ms, ratio {warm[0] / cold[0]:.2f}; end of "
              f"prompt cold {1e3 * cold[2]:.0f} ms, warm {1e3 * warm[2]:.0f} ms, ratio {warm[2] / cold[2]:.2f}")

    # head-of-line
    shorts = [(f"s{i}", words_ok(words(8))) for i in range(args.short)]
    long_req = ("long", words_ok(words(args.long)))
    from clover.serving.scheduler import SchedulerConfig

    small = dict(prefill_chunk=128, max_step_tokens=128)
    share = SchedulerConfig.prefill_share if args.prefill_share is None else args.prefill_share
    for name, settings in [(f"2048 / step, pieces of 512, prefill share {share:.2f}", {}),
                           ("2048 / step, no prefill share", dict(prefill_share=None)),
                           (f"128 / step, pieces of 128, prefill share {share:.2f}", small),
                           ("128 / step, pieces of 128, no prefill share", dict(small, prefill_share=None)),
                           ("no budget (4096 pieces)", dict(prefill_chunk=4096, max_step_tokens=1 << 30,
                                                            prefill_share=None))][:args.settings]:
        if args.prefill_share is not None:
            settings = {"prefill_share": args.prefill_share} | settings
        idle = drive(make_engine(model, tok, prefix_cache_mb=0, **settings), shorts, cfg,
                     submit_at=list(range(0, 2 * len(shorts), 2)))
        busy = drive(make_engine(model, tok, prefix_cache_mb=0, **settings), [long_req] + shorts, cfg,
                     submit_at=[0] + list(range(1, 2 * len(shorts) + 1, 2)))
        lat_idle = sorted(v[1] for v in idle.values())
        lat_busy = sorted(busy[r][1] for r, _ in shorts)
        p99 = lambda xs: xs[min(len(xs) - 1, int(0.99 * len(xs)))]  # noqa: E731
        print(f"head-of-line, {name}: 8-token requests during a {args.long}-token prefill: p50 "
              f"{1e3 * statistics.median(lat_busy):.0f} ms, p99 {1e3 * p99(lat_busy):.0f} ms; idle p50 "
              f"{1e3 * statistics.median(lat_idle):.0f} ms, p99 {1e3 * p99(lat_idle):.0f} ms; p99 ratio "
              f"{p99(lat_busy) / p99(lat_idle):.2f}; long request {busy['long'][1]:.1f} s")


if __name__ == "__main__":
    main()
