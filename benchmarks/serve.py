"""Serving: throughput and latency of `clover serve` at concurrency 1, 4, 16, 64 for each decoding
mode (block diffusion, self-speculative, AR: the request's `mode` field, one server, one model), and
its overhead over `clover generate` at batch 1.

Reproduce:  python benchmarks/serve.py                       (the embedded model, else a random one)
            python benchmarks/serve.py --write BENCHMARKS.md  (also rewrites the "Serving" section)
            python benchmarks/serve.py --model DIR --device cuda

The server runs as a subprocess (`python -m clover.cli.main serve`) on a free loopback port; the
clients are `openai.AsyncOpenAI` streams in this process (closed loop: each of C workers sends its
next request when the previous one ends). Per level and mode (the modes run one after another at
each concurrency, on the same prompts): output tokens/s over the level's wall time and its ratio to
AR's, p50/p99 request latency, p50/p99 time to the first streamed text, and failed requests; then
whether every self-speculative text equals the AR text of the same prompt (greedy, so C6 says it
must). Prompts are eval prompts of the synthetic tasks, greedy, no thinking.

Server overhead: the same prompt and settings, one request at a time, end-to-end over HTTP,
against `clover generate`'s own code path (`generate_text`, in this process, same device, dtype
and thread count); both warm, interleaved, median of `--repeats` each.

Without the embedded model (`clover.default_model_dir()`), a random small Clover is built and
saved to a temporary directory; its lm_head is scaled so distributions are peaked. A random model
rarely emits EOS, so every request then writes `--max-tokens` tokens.
"""

import argparse
import asyncio
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import random_checkpoint, write_section  # noqa: E402


def resolve_model(args, tmp: Path) -> tuple[Path, str]:
    if args.model:
        return Path(args.model), Path(args.model).name
    import clover

    try:
        return Path(clover.default_model_dir()), "embedded (clover-tiny)"
    except (AttributeError, FileNotFoundError):
        return random_checkpoint(tmp / "random-clover", args.head_scale), "random small Clover (no embedded model)"


def prompts(n: int) -> list[str]:
    from clover.data import eval_examples

    examples = eval_examples(max(1, -(-n // 2)), seed=0)
    return [e.prompt for e in examples][:n]


# -- server ------------------------------------------------------------------------------------

def start_server(model_dir: Path, args, log_path: Path) -> tuple[subprocess.Popen, str]:
    from clover.loading import pick_device

    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "clover.cli.main", "serve", "--model", str(model_dir), "--port", str(port),
           "--served-model-name", "bench", "--max-batch-size", str(max(args.concurrency)),
           "--max-queue", "4096", "--dtype", args.dtype, "--device", str(pick_device(args.device))]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    proc = subprocess.Popen(cmd, stdout=log_path.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"the server did not start; see {log_path}")
        time.sleep(0.25)


def metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    line = next(line for line in text.splitlines() if line.startswith(name + " "))
    return float(line.split()[1])


# -- load generation ---------------------------------------------------------------------------

MODES = ("block_diffusion", "self_spec", "ar")


def request_body(prompt: str, args, mode: str = "block_diffusion") -> dict:
    return dict(model="bench", messages=[{"role": "user", "content": prompt}], max_tokens=args.max_tokens,
                temperature=0, extra_body={"block_size": args.block_size, "enable_thinking": False, "mode": mode})


async def one_stream(client, prompt: str, args, mode: str) -> dict:
    start = time.perf_counter()
    first, tokens, text = None, 0, []
    stream = await client.chat.completions.create(**request_body(prompt, args, mode), stream=True,
                                                  stream_options={"include_usage": True})
    async for chunk in stream:
        piece = chunk.choices[0].delta.content if chunk.choices else None
        if first is None and piece:
            first = time.perf_counter() - start
        text.append(piece or "")
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    latency = time.perf_counter() - start
    return dict(latency=latency, ttfb=first if first is not None else latency, tokens=tokens, prompt=prompt,
                text="".join(text))


async def run_level(url: str, concurrency: int, requests: list[str], args, mode: str) -> dict:
    import openai

    client = openai.AsyncOpenAI(api_key="unused", base_url=url + "/v1", max_retries=0, timeout=3600,
                                http_client=None)
    queue = list(requests)
    results, failures = [], 0

    async def worker():
        nonlocal failures
        while queue:
            prompt = queue.pop()
            try:
                results.append(await one_stream(client, prompt, args, mode))
            except Exception as e:  # noqa: BLE001 - counted and reported
                failures += 1
                print(f"  request failed: {type(e).__name__}: {e}", file=sys.stderr)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    await client.close()
    return dict(concurrency=concurrency, mode=mode, requests=len(requests), failures=failures, wall=wall,
                tokens=sum(r["tokens"] for r in results), latencies=[r["latency"] for r in results],
                ttfbs=[r["ttfb"] for r in results], texts={r["prompt"]: r["text"] for r in results})


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- overhead against `clover generate` --------------------------------------------------------

def batch1_overhead(url: str, model_dir: Path, prompt: str, args) -> dict:
    """Median wall time of one server request (HTTP, non-streaming) and of `clover generate`'s
    `generate_text` (in this process, same device / dtype / threads), interleaved so that both see
    the same machine load; both warm, same prompt and greedy settings."""
    import openai
    import torch

    from clover.cli.generate import generate_text
    from clover.cli.main import build_parser
    from clover.loading import LoadOptions, load_model_and_tokenizer, pick_device

    if args.threads:
        torch.set_num_threads(args.threads)
    device = str(pick_device(args.device))
    model, tokenizer = load_model_and_tokenizer(model_dir, LoadOptions(device=device, dtype=args.dtype))
    cli = build_parser().parse_args(["generate", prompt, "--chat", "--no-thinking", "--temperature", "0",
                                     "--max-new-tokens", str(args.max_tokens),
                                     "--block-size", str(args.block_size), "--device", device])
    client = openai.OpenAI(api_key="unused", base_url=url + "/v1", max_retries=0, timeout=3600)

    def generate() -> tuple[float, int]:
        err = io.StringIO()
        start = time.perf_counter()
        generate_text(model, tokenizer, cli, prompt, io.StringIO(), err)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - start, int(err.getvalue().strip("[\n").split(" tokens")[0])

    def serve() -> tuple[float, int]:
        start = time.perf_counter()
        r = client.chat.completions.create(**request_body(prompt, args))
        return time.perf_counter() - start, r.usage.completion_tokens

    runs = {"server": [], "generate": []}
    for i in range(args.repeats + 1):  # the first round warms up
        for name, fn in (("server", serve), ("generate", generate)) if i % 2 else (("generate", generate),
                                                                                 ("server", serve)):
            seconds, tokens = fn()
            if i:
                runs[name].append((seconds, tokens))
    tokens = {name: {t for _, t in r} for name, r in runs.items()}
    if tokens["server"] != tokens["generate"]:
        print(f"warning: token counts differ: {tokens}", file=sys.stderr)
    return dict(server=statistics.median(s for s, _ in runs["server"]),
                generate=statistics.median(s for s, _ in runs["generate"]),
                tokens=runs["server"][0][1])


# -- report ------------------------------------------------------------------------------------

def throughput(level: dict) -> float:
    return level["tokens"] / level["wall"]


def ar_ratio(level: dict, levels: list[dict]) -> str:
    ar = next((lv for lv in levels if lv["mode"] == "ar" and lv["concurrency"] == level["concurrency"]), None)
    return "n/a" if ar is None else f"{throughput(level) / throughput(ar):.2f}x"


def same_text(levels: list[dict]) -> tuple[int, int]:
    """(self_spec texts equal to the AR text of the same prompt, pairs compared), over all levels."""
    ar = {p: t for lv in levels if lv["mode"] == "ar" for p, t in lv["texts"].items()}
    pairs = [(t, ar[p]) for lv in levels if lv["mode"] == "self_spec" for p, t in lv["texts"].items() if p in ar]
    return sum(a == b for a, b in pairs), len(pairs)


def goals(levels: list[dict]) -> list[str]:
    """The issue's goals, each met or missed by this run's figures."""
    def ratio(mode, c):
        lv = next((x for x in levels if x["mode"] == mode and x["concurrency"] == c), None)
        ar = next((x for x in levels if x["mode"] == "ar" and x["concurrency"] == c), None)
        return None if lv is None or ar is None else throughput(lv) / throughput(ar)

    def verdict(ok):
        return "n/a" if ok is None else ("**met**" if ok else "**missed**")

    levels_c = sorted({lv["concurrency"] for lv in levels})
    c1 = levels_c[0] if levels_c else None
    bd1, ss1 = ratio("block_diffusion", c1), ratio("self_spec", c1)
    bd_all = [ratio("block_diffusion", c) for c in levels_c]
    equal, pairs = same_text(levels)
    lines = []
    if bd1 is not None:
        lines.append(f"- block diffusion >= 2x AR tokens/s at concurrency {c1}: {bd1:.2f}x, {verdict(bd1 >= 2)}.")
    if all(r is not None for r in bd_all) and bd_all:
        lines.append("- block diffusion >= AR at every concurrency: "
                     + ", ".join(f"{r:.2f}x" for r in bd_all) + f", {verdict(min(bd_all) >= 1)}.")
    if ss1 is not None:
        lines.append(f"- self-spec >= 1.5x AR tokens/s at concurrency {c1}: {ss1:.2f}x, {verdict(ss1 >= 1.5)}.")
    if pairs:
        lines.append(f"- self-spec text identical to AR text: {equal} of {pairs} requests, {verdict(equal == pairs)}.")
    return lines


def report(levels: list[dict], overhead: dict | None, setting: dict) -> list[str]:
    lines = [
        f"Model: {setting['model']}; device {setting['device']}, dtype {setting['dtype']}, "
        f"threads {setting['threads']}; greedy, block size {setting['block_size']} (block diffusion and "
        f"self-spec drafts), max_tokens {setting['max_tokens']}, no thinking; {setting['machine']}. "
        f"Reproduce: `{setting['command']}`. All modes on one server and model, one after another at "
        "each concurrency, on the same prompts.",
        "",
        "| concurrency | mode | requests | failed | output tokens/s | vs AR | latency p50 (s) | latency p99 (s) "
        "| first text p50 (s) | first text p99 (s) | tokens/forward |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for lv in levels:
        lines.append(
            f"| {lv['concurrency']} | {lv['mode']} | {lv['requests']} | {lv['failures']} "
            f"| {throughput(lv):.1f} | {ar_ratio(lv, levels)} "
            f"| {percentile(lv['latencies'], 0.5):.3f} | {percentile(lv['latencies'], 0.99):.3f} "
            f"| {percentile(lv['ttfbs'], 0.5):.3f} | {percentile(lv['ttfbs'], 0.99):.3f} "
            f"| {lv['tokens_per_forward']:.2f} |")
    lines += ["", "tokens/forward = output tokens per row-forward (a request's share of one batched forward); the "
              "server runs one forward per (phase, block size) group per step, and a self-spec iteration is two "
              "(draft, verify). Self-spec and AR rows share the engine's steps with block diffusion (one "
              "forward per phase group: AR steps together, verifies together, drafts grouped by how many "
              "kept tokens they commit). On a model this small a forward costs about the same whatever "
              "its token count, so the ratios follow tokens/forward and the per-step overhead; AR also "
              "streams one chunk per token.", "", "Goals (issue 10):", *goals(levels)]
    if overhead is None:
        return lines
    ratio = overhead["server"] / overhead["generate"] - 1
    lines += [
        "",
        f"Batch-1 overhead (same prompt, {overhead['tokens']} tokens, median of {setting['repeats']}): "
        f"`clover generate` {overhead['generate'] * 1000:.1f} ms, server over HTTP "
        f"{overhead['server'] * 1000:.1f} ms: **{ratio * 100:+.1f}%** (goal < +10%).",
    ]
    return lines


def launch_prefix() -> str:
    """The thread setting and niceness this run had, as the shell prefix that reproduces them."""
    threads = os.environ.get("OMP_NUM_THREADS")
    niceness = os.nice(0)
    return (f"OMP_NUM_THREADS={threads} " if threads else "") + (f"nice -n {niceness} " if niceness else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint dir (default: embedded, else a random model)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for the engine and generate")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16, 64])
    p.add_argument("--modes", type=lambda s: [m for m in s.split(",") if m], default=list(MODES),
                   help=f"decoding modes to measure, comma-separated (default: {','.join(MODES)})")
    p.add_argument("--requests", type=int, default=2, help="requests per level = max(this x concurrency, 8)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=10, help="runs for the batch-1 overhead medians (0: skip it)")
    p.add_argument("--head-scale", type=float, default=60.0, help="lm_head scale of the random model")
    p.add_argument("--write", type=Path, default=None, help="rewrite the Serving section of this file")
    args = p.parse_args()
    bad = [m for m in args.modes if m not in MODES]
    if bad or not args.modes:
        p.error(f"--modes {','.join(args.modes)}: each must be one of {','.join(MODES)}")

    with tempfile.TemporaryDirectory() as tmp:
        model_dir, model_name = resolve_model(args, Path(tmp))
        pool = prompts(max(max(args.concurrency) * args.requests, 8))
        proc, url = start_server(model_dir, args, Path(tmp) / "server.log")
        try:
            for mode in args.modes:
                asyncio.run(run_level(url, 2, pool[:4], args, mode))  # warm up
            levels = []
            for c in args.concurrency:
                for mode in args.modes:
                    rows_before = metric(url, "clover_row_forwards_total")
                    tokens_before = metric(url, "clover_generation_tokens_total")
                    level = asyncio.run(run_level(url, c, pool[:max(c * args.requests, 8)], args, mode))
                    rows = metric(url, "clover_row_forwards_total") - rows_before
                    level["tokens_per_forward"] = (metric(url, "clover_generation_tokens_total") - tokens_before) / rows
                    levels.append(level)
                    print(f"concurrency {c} {mode}: {throughput(level):.1f} tokens/s, "
                          f"{level['failures']} failed", flush=True)
            overhead = batch1_overhead(url, model_dir, pool[0], args) if args.repeats else None
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    import torch

    from clover.loading import pick_device
    device = pick_device(args.device)
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    setting = dict(model=model_name, device=str(device), dtype=dtype,
                   threads=args.threads or torch.get_num_threads(), block_size=args.block_size,
                   max_tokens=args.max_tokens, repeats=args.repeats,
                   machine=f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs, load average "
                           f"{os.getloadavg()[0]:.1f} at the end (other jobs share the machine)",
                   command=launch_prefix() + "python benchmarks/serve.py " + " ".join(sys.argv[1:]))
    lines = report(levels, overhead, setting)
    print("\n".join(lines))
    if args.write:
        write_section(args.write, "Serving", lines)
    print(json.dumps({"levels": [{k: v for k, v in lv.items() if k not in ("latencies", "ttfbs", "texts")}
                                 for lv in levels], **(overhead or {})}))


if __name__ == "__main__":
    main()
