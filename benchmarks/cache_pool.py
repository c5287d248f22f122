"""Decode step time of the serving engine at long context: the cache pool against its stacked twin.

Reproduce:  OMP_NUM_THREADS=1 python benchmarks/cache_pool.py [--context 8192 --rows 4 --steps 40]

`--rows` requests share a `--context`-token prompt prefix (each adds 8 tokens of its own) and
decode with EOS off (embedded model, fp32, in process). The first request prefills the prefix;
the others start from the prefix cache. Once every request is past its prompt, the next `--steps`
engine steps are timed (denoising forwards plus fused commits). Same requests and the same tokens
on both paths: the pool (`EngineConfig()`) reads each row's keys in place; the twin
(`cache_pool=False`, the engine before the pool) stacks the rows' caches into one padded batch,
concatenates the keys in every attention forward and splits the caches back after each commit.
The two engines take single steps in turn, so both see the same machine load.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from common import embedded_engine_inputs  # noqa: E402


def prepared(model, tok, cfg, prompts, pool: bool):
    """An engine whose requests are all past their prompts; returns (engine, outputs per request)."""
    from clover.serving.engine import Engine, EngineConfig
    from clover.serving.scheduler import EngineRequest

    engine = Engine(model, tok, EngineConfig(cache_pool=pool))
    outs = {}
    with torch.inference_mode():
        for i, ids in enumerate(prompts):
            outs[i] = []
            engine.submit(EngineRequest(f"r{i}", ids, cfg), outs[i].append)
            while engine.scheduler.num_waiting or any(s.in_prompt for s in engine.scheduler.running):
                engine.step()  # one at a time, so the later ones hit the prefix cache
    return engine, outs


def timed_step(engine) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        engine.step()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model, tok, cfg = embedded_engine_inputs(32 * (args.steps + 4))
    g = torch.Generator().manual_seed(0)
    words = lambda n: torch.randint(10, model.config.vocab_size - 10, (n,), generator=g).tolist()  # noqa: E731
    prefix = words(args.context)
    prompts = [prefix + words(8) for _ in range(args.rows)]
    engines = {name: prepared(model, tok, cfg, prompts, name == "pool") for name in ("pool", "twin")}
    before = {name: e.metrics.value("clover_generation_tokens_total") for name, (e, _) in engines.items()}
    times = {"pool": [], "twin": []}
    for step in range(args.steps):  # alternate single steps: both paths see the same machine load
        for name in (("pool", "twin") if step % 2 == 0 else ("twin", "pool")):
            times[name].append(timed_step(engines[name][0]))
    texts = {name: [[t for o in outs[i] for t in o.new_token_ids] for i in outs] for name, (_, outs) in engines.items()}
    print(f"context {args.context}, {args.rows} rows, {args.steps} decode steps each, alternating; same tokens "
          f"on both paths: {texts['pool'] == texts['twin']}; prefix tokens restored: "
          f"{engines['pool'][0].metrics.value('clover_prefix_cache_hit_tokens_total'):.0f}")
    for name, (engine, _) in engines.items():
        tokens = engine.metrics.value("clover_generation_tokens_total") - before[name]
        print(f"{name}: step median {1000 * statistics.median(times[name]):.1f} ms, "
              f"mean {1000 * statistics.mean(times[name]):.1f} ms, {tokens / sum(times[name]):.1f} tokens/s")
    ratios = sorted(a / b for a, b in zip(times["pool"], times["twin"]))
    print(f"pool / twin step time, median of per-step ratios: {statistics.median(ratios):.3f}")

if __name__ == "__main__":
    main()
