"""Per-layer forward time of the real-widths slice on this CPU against its memory-bandwidth limit.

Reproduce:  python benchmarks/real_width_checkpoint.py --steps write convert   (the slice, ~18 GB disk)
            python benchmarks/real_width.py /tmp/clover-real-width/clover [--threads N] [--repeats 5]

Steps timed (bf16, after a `--context`-token causal prefix in the cache): an AR decode step (1 token;
also with oneDNN's kernels, as before `clover.model.modeling_clover_moe`),
32-token block steps with and without the MoE coreset (the first denoising step: 32 masks; a
half-denoised block: 16 random tokens and 16 masks, logits for the masked 16), and the fused commit
(32 committed tokens causal + the next block's 32 masks, coreset on). Each unit (embedding, each
decoder layer, final norm + head) is timed by forward hooks; median of `--repeats` runs after
`--warmup`, the steps interleaved.

Weight bytes a call reads: every parameter of the token mixer (GDN or attention), the norms, router,
shared expert and its gate, and the routed experts it hits (distinct experts with nonzero weight over
all tokens of the call, counted by a hook) at 3 x 512 x 2048 bf16 each; the head reads the whole
lm_head; the embedding only its rows. Limit = bytes / bandwidth, with the bandwidth of a plain copy
of a `--copy-gib` tensor (bytes read + bytes written per second), timed between the steps so that
it sees the same machine load. Times are CPU time of this process (wall time in brackets): on a
shared core a niced benchmark gets a fraction of the wall clock, and its CPU time is what the step
costs on the core (memory stalls included).

The slice's random router (std 0.02) routes near-uniformly; like `forward.py`, the router weights are
redrawn with std 2/sqrt(hidden) (peaked, as in trained routers) unless `--keep-router`. The 40-layer
figures are an extrapolation: embedding + 30 x the mean GDN layer + 10 x the attention layer + head.
"""

import argparse
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from clover.model import CloverMoeForCausalLM  # noqa: E402
from clover.model import modeling_clover_moe as cpu_kernels  # noqa: E402

BLOCK = 32
FULL_LAYERS = {"linear_attention": 30, "full_attention": 10}  # the released 40-layer model


def clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def since(start: tuple[float, float]) -> tuple[float, float]:
    """(wall, CPU) seconds since `start`."""
    now = clocks()
    return now[0] - start[0], now[1] - start[1]


class CopyProbe:
    """A plain copy of a `gib` GiB tensor, timed between the steps so that it sees the same load."""

    def __init__(self, gib: float):
        self.src = torch.ones(int(gib * 2**30), dtype=torch.uint8)
        self.dst = torch.empty_like(self.src)
        self.seconds = []  # (wall, CPU) per run

    def run(self) -> None:
        start = clocks()
        self.dst.copy_(self.src)
        self.seconds.append(since(start))

    def bandwidth(self, clock: int) -> float:
        """Bytes moved (read + written) per second of wall (clock 0) or CPU (1) time, median over
        the runs after the first."""
        return 2 * self.src.nbytes / statistics.median(s[clock] for s in self.seconds[1:])


class UnitProbe:
    """Forward hooks: (wall, CPU) seconds per unit (embed, layer i, final norm + head) and distinct
    experts per layer."""

    def __init__(self, model: CloverMoeForCausalLM):
        self.units = {"embed": model.model.embed_tokens, "head": model.lm_head,
                      **{f"layer {i}": layer for i, layer in enumerate(model.model.layers)}}
        self.seconds, self.experts, self._start = {}, {}, {}
        for name, unit in self.units.items():
            unit.register_forward_pre_hook(lambda m, a, name=name: self._start.__setitem__(name, clocks()))
            unit.register_forward_hook(lambda m, a, o, name=name: self.seconds.__setitem__(
                name, since(self._start[name])))
        for i, layer in enumerate(model.model.layers):
            layer.mlp.experts.register_forward_pre_hook(lambda m, a, i=i: self.experts.__setitem__(
                f"layer {i}", a[1].experts[a[1].weights > 0].unique().numel()))
        model.model.norm.register_forward_pre_hook(lambda m, a: self._start.__setitem__("norm", clocks()))

    def take(self) -> tuple[dict, dict]:
        # the final norm runs right before the head: count it with the head
        seconds = dict(self.seconds)
        norm_to_head = [n - h for n, h in zip(self._start["head"], self._start["norm"])]
        seconds["head"] = tuple(x + y for x, y in zip(seconds["head"], norm_to_head))
        out = seconds, dict(self.experts)
        self.seconds, self.experts = {}, {}
        return out


def weight_bytes(model: CloverMoeForCausalLM, unit: str, experts: int, tokens: int) -> int:
    """Bytes of weights `unit` reads in a call over `tokens` tokens that hits `experts` routed experts."""
    if unit == "embed":
        return tokens * model.model.embed_tokens.weight[0].nbytes
    if unit == "head":
        return model.lm_head.weight.nbytes + model.model.norm.weight.nbytes
    layer = model.model.layers[int(unit.split()[1])]
    routed = layer.mlp.experts
    per_expert = routed.gate_up_proj[0].nbytes + routed.down_proj[0].nbytes
    static = sum(p.nbytes for n, p in layer.named_parameters() if not n.startswith("mlp.experts."))
    return static + experts * per_expert


def steps(model: CloverMoeForCausalLM, context: int, seed: int = 1) -> dict:
    """name -> (run(cache), make_cache, tokens); the cache holds `context` causal tokens."""
    vocab, mask = model.config.vocab_size, model.config.mask_token_id
    gen = torch.Generator().manual_seed(seed)
    cache = model.new_cache()
    model(torch.randint(0, mask, (1, context), generator=gen), past_key_values=cache, logits_to_keep=1)
    token = torch.randint(0, mask, (1, 1), generator=gen)
    masks = torch.full((1, BLOCK), mask)
    half = masks.clone()
    half[:, ::2] = torch.randint(0, mask, (1, BLOCK // 2), generator=gen)
    masked_columns = torch.arange(1, BLOCK, 2)
    committed = torch.randint(0, mask, (1, BLOCK), generator=gen)
    assert vocab > mask

    def block(ids, coreset, keep=0):
        return (lambda c: model(ids, past_key_values=c, block_len=BLOCK, use_coreset=coreset,
                                logits_to_keep=keep), lambda: cache, BLOCK)

    def onednn_decode(c):  # the step as it ran before clover.model.modeling_clover_moe
        saved, cpu_kernels.prefers_native_gemv = cpu_kernels.prefers_native_gemv, lambda *args: False
        try:
            return model(token, past_key_values=c)
        finally:
            cpu_kernels.prefers_native_gemv = saved

    return {
        "AR decode step": (lambda c: model(token, past_key_values=c), cache.snapshot, 1),
        "AR decode step, oneDNN GEMV": (onednn_decode, cache.snapshot, 1),
        "block, 32 masks, no coreset": block(masks, False),
        "block, 32 masks, coreset": block(masks, True),
        "block, half-denoised, no coreset": block(half, False, masked_columns),
        "block, half-denoised, coreset": block(half, True, masked_columns),
        "fused commit (32 + 32 masks), coreset": (
            lambda c: model(torch.cat((committed, masks), 1), past_key_values=c, block_len=BLOCK,
                            use_coreset=True, logits_to_keep=BLOCK), cache.snapshot, 2 * BLOCK),
    }


def measure(probe: UnitProbe, copy: CopyProbe, cases: dict, repeats: int, warmup: int) -> dict:
    """name -> {"total": (wall, CPU) ms, "units": {unit: (wall, CPU) ms}, "experts": {layer: n}}
    (medians); the steps and the copy run interleaved."""
    runs = defaultdict(list)
    for i in range(warmup + repeats):
        copy.run()
        for name, (run, make_cache, _) in cases.items():
            c = make_cache()
            start = clocks()
            run(c)
            total = since(start)
            seconds, experts = probe.take()
            if i >= warmup:
                runs[name].append((total, seconds, experts))
    med = lambda pairs: tuple(statistics.median(p[j] for p in pairs) * 1e3 for j in (0, 1))
    return {name: {"total": med([r[0] for r in rs]),
                   "units": {u: med([r[1][u] for r in rs]) for u in rs[0][1]},
                   "experts": {u: statistics.median(r[2][u] for r in rs) for u in rs[0][2]}}
            for name, rs in runs.items()}


def summarise(model, name: str, r: dict, tokens: int, bandwidth: float) -> dict:
    """Per kind of unit: CPU and wall ms, distinct experts, bytes, limit ms; the slice's sums and the
    40-layer extrapolation (of CPU ms, bytes and limit)."""
    kinds = {"embed": ["embed"], "head": ["head"]}
    for i, layer in enumerate(model.model.layers):
        kinds.setdefault(layer.kind, []).append(f"layer {i}")
    rows = {}
    for kind, units in kinds.items():
        nbytes = statistics.mean(weight_bytes(model, u, r["experts"].get(u, 0), tokens) for u in units)
        rows[kind] = {"wall_ms": statistics.mean(r["units"][u][0] for u in units),
                      "ms": statistics.mean(r["units"][u][1] for u in units),
                      "experts": statistics.mean(r["experts"].get(u, 0) for u in units),
                      "bytes": nbytes, "limit_ms": nbytes / bandwidth * 1e3}
    scale = {"embed": 1, "head": 1, **FULL_LAYERS}
    keys = ("ms", "wall_ms", "bytes", "limit_ms")
    full = {k: sum(scale[kind] * rows[kind][k] for kind in rows) for k in keys}
    slice_sum = {k: sum(rows[kind][k] * len(kinds[kind]) for kind in rows) for k in keys}
    return {"name": name, "total": r["total"], "rows": rows, "slice": slice_sum, "full": full}


def report(results: list[dict], copy: CopyProbe, threads: int, context: int) -> str:
    wall_bw, cpu_bw = copy.bandwidth(0), copy.bandwidth(1)
    lines = [f"copy bandwidth {cpu_bw / 1e9:.1f} GB/s of CPU time ({wall_bw / 1e9:.1f} GB/s of wall time), "
             f"bytes read + written; threads {threads}; bf16; context {context} tokens. "
             "ms = CPU time (wall in brackets); the limit uses the CPU-time bandwidth.", "",
             "| step | unit | ms (wall) | distinct experts | weight MB read | limit ms | ms / limit |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for s in results:
        for kind, row in s["rows"].items():
            experts = f"{row['experts']:.1f}" if kind not in ("embed", "head") else "–"
            lines.append(f"| {s['name']} | {kind} | {row['ms']:.1f} ({row['wall_ms']:.1f}) | {experts} | "
                         f"{row['bytes'] / 1e6:.0f} | {row['limit_ms']:.1f} | {row['ms'] / row['limit_ms']:.2f} |")
    ar = results[0]["full"]["ms"]
    lines += ["", "| step | slice ms (wall) | 40 layers ms, extrapolated (wall) | 40-layer GB read | "
              "40-layer limit ms | ms / limit | / AR step |", "|---|---:|---:|---:|---:|---:|---:|"]
    for s in results:
        f = s["full"]
        lines.append(f"| {s['name']} | {s['total'][1]:.0f} ({s['total'][0]:.0f}) | {f['ms']:.0f} ({f['wall_ms']:.0f}) | "
                     f"{f['bytes'] / 1e9:.2f} | {f['limit_ms']:.0f} | {f['ms'] / f['limit_ms']:.2f} | {f['ms'] / ar:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="the converted slice (real_width_checkpoint.py)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--copy-gib", type=float, default=0.5)
    parser.add_argument("--keep-router", action="store_true", help="keep the checkpoint's router weights")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = CloverMoeForCausalLM.from_pretrained(args.checkpoint, dtype=torch.bfloat16)
    with torch.inference_mode():
        if not args.keep_router:
            torch.manual_seed(0)
            for layer in model.model.layers:
                layer.mlp.gate.weight.normal_(0.0, 2.0 / model.config.hidden_size ** 0.5)
        probe, copy = UnitProbe(model), CopyProbe(args.copy_gib)
        cases = steps(model, args.context)
        probe.take()
        results = measure(probe, copy, cases, args.repeats, args.warmup)
    summaries = [summarise(model, name, results[name], cases[name][2], copy.bandwidth(1)) for name in cases]
    print(report(summaries, copy, torch.get_num_threads(), args.context))


if __name__ == "__main__":
    main()
