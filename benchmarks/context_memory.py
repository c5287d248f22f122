"""Peak memory of the serving engine at long context: the cache pool against its stacked twin.

Reproduce:  OMP_NUM_THREADS=1 python benchmarks/context_memory.py [--context 16384 --rows 4 --steps 8]

Each engine runs in its own child process (peak RSS is per process): the embedded model is loaded
(fp32), the peak is reset (`/proc/self/clear_refs`, Linux), then `--rows` requests sharing a
`--context`-token prompt prefill and decode `--steps` engine steps with EOS off. Reported, in MB of
RSS above the loaded model: what is held after the prefill, the peak during the prefill, and the
peak during the decode steps (the peak is reset again after the prefill), against the bytes of KV
the requests hold (keys and values of every attention layer, fp32). The twin (the engine
before the pool) concatenates the keys in every attention forward and stacks every row's cache
each step, so its peak holds the KV bytes more than once.
"""

import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def child(engine: str, context: int, rows: int, steps: int, threads: int) -> dict:
    import torch
    from common import embedded_engine_inputs

    from clover.serving.engine import Engine, EngineConfig
    from clover.serving.scheduler import EngineRequest, SchedulerConfig

    torch.set_num_threads(threads)
    model, tok, cfg = embedded_engine_inputs(max_new_tokens=64 * steps)
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, model.config.mask_token_id, (context,), generator=g).tolist()
    prompts = [prefix + torch.randint(0, model.config.mask_token_id, (8,), generator=g).tolist()
               for _ in range(rows)]
    # no step budget: the rows prefill in lockstep, so all of them decode together afterwards (with
    # the budget the first prompt finishes first and its request can end before the last prefill)
    scheduler = SchedulerConfig(max_step_tokens=1 << 30, prefill_share=None)
    engine_ = Engine(model, tok, EngineConfig(scheduler, cache_pool=engine == "pool"))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = status_kb("VmRSS")
    with torch.inference_mode():
        for i, ids in enumerate(prompts):
            engine_.submit(EngineRequest(f"r{i}", ids, cfg), lambda out: None)
        while engine_.scheduler.num_waiting or any(s.in_prompt for s in engine_.scheduler.running):
            engine_.step()
        prefill_peak = status_kb("VmHWM") - before
        held = status_kb("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        decoding = engine_.scheduler.num_running
        for _ in range(steps):
            engine_.step()
    cfg_ = model.config
    n_attn = sum(t == "full_attention" for t in cfg_.layer_types)
    kv_bytes = rows * (context + 8) * n_attn * 2 * cfg_.num_key_value_heads * cfg_.head_dim * 4
    return dict(engine=engine, prefill_peak_mb=prefill_peak / 1024, held_mb=(held - before) / 1024,
                decode_peak_mb=(status_kb("VmHWM") - before) / 1024, kv_mb=kv_bytes / 2**20,
                decoding=decoding)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--context", type=int, default=16384)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--child", choices=("pool", "twin"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.context, args.rows, args.steps, args.threads)))
        return
    results = []
    for engine in ("pool", "twin"):
        cmd = [sys.executable, __file__, "--child", engine, "--context", str(args.context),
               "--rows", str(args.rows), "--steps", str(args.steps), "--threads", str(args.threads)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    print(f"context {args.context}, {args.rows} rows, {args.steps} decode steps, {args.threads} thread(s)")
    print("| engine | rows decoding | KV the requests hold (MB) | RSS after prefill | peak in prefill "
          "| peak in decode | decode peak / KV |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['engine']} | {r['decoding']} | {r['kv_mb']:.0f} | {r['held_mb']:.0f} | {r['prefill_peak_mb']:.0f} "
              f"| {r['decode_peak_mb']:.0f} | {r['decode_peak_mb'] / r['kv_mb']:.2f} |")
    print("(MB of RSS above the loaded model)")
    print(f"pool / twin decode peak: {results[0]['decode_peak_mb'] / results[1]['decode_peak_mb']:.2f}")


if __name__ == "__main__":
    main()
