"""Evaluate a model on held-out task prompts with block diffusion and with AR decoding, in one run.

Each prompt is decoded alone (batch of one, greedy), since batch-1 latency is what block diffusion
is for; accuracy comes from the tasks' exact-match scorers. Timing covers `generate` only
(prefill included), summed over prompts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
from tqdm import tqdm

from clover.data import Example, format_chat, get_task


@dataclass
class DecodeSummary:
    mode: str  # "block_diffusion" or "ar"
    n: int = 0
    correct: int = 0
    new_tokens: int = 0
    forwards: int = 0  # decoding forwards (prefill chunks excluded)
    seconds: float = 0.0
    per_task: dict[str, list[int]] = field(default_factory=dict)  # task -> [correct, n]

    @property
    def accuracy(self) -> float:
        return self.correct / max(self.n, 1)

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / max(self.forwards, 1)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / max(self.seconds, 1e-9)


@dataclass
class EvalReport:
    model: str
    task: str
    threshold: float
    block_size: int
    diffusion: DecodeSummary
    ar: DecodeSummary | None

    def to_json(self) -> dict:
        out = {
            "model": self.model, "task": self.task, "n": self.diffusion.n,
            "threshold": self.threshold, "block_size": self.block_size,
            "accuracy": self.diffusion.accuracy,
            "tokens_per_forward": self.diffusion.tokens_per_forward,
            "tokens_per_second": self.diffusion.tokens_per_second,
            "per_task_accuracy": {t: c / n for t, (c, n) in self.diffusion.per_task.items()},
        }
        if self.ar is not None:
            out |= {"ar_accuracy": self.ar.accuracy, "ar_tokens_per_second": self.ar.tokens_per_second,
                    "speedup_vs_ar": self.diffusion.tokens_per_second / max(self.ar.tokens_per_second, 1e-9)}
        return out


def _decode_one(model, tokenizer, example: Example, mode: str, settings: dict):
    prompt, _ = format_chat(tokenizer, example)
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(model.device)
    start = time.perf_counter()
    out = model.generate(ids, mode=mode, do_sample=False, return_dict_in_generate=True, **settings)
    seconds = time.perf_counter() - start
    new = out.sequences[0, ids.shape[1]:ids.shape[1] + out.rows[0].new_tokens]
    text = tokenizer.decode(new, skip_special_tokens=True)
    return text, out.rows[0].new_tokens, out.num_forward_passes - out.num_prefill_forwards, seconds


def decode_all(model, tokenizer, examples: Sequence[Example], mode: str, settings: dict,
               progress: Callable | None = None) -> DecodeSummary:
    summary = DecodeSummary(mode)
    tasks = {}
    for example in examples:
        task = tasks.setdefault(example.task, get_task(example.task))
        text, tokens, forwards, seconds = _decode_one(model, tokenizer, example, mode, settings)
        correct = bool(task.score(example, text)["correct"])
        summary.n += 1
        summary.correct += correct
        summary.new_tokens += tokens
        summary.forwards += forwards
        summary.seconds += seconds
        counts = summary.per_task.setdefault(example.task, [0, 0])
        counts[0] += correct
        counts[1] += 1
        if progress is not None:
            progress(summary)
    return summary


@torch.inference_mode()
def evaluate(model, tokenizer, examples: Sequence[Example], *, model_name: str = "", task: str = "all",
             threshold: float = 0.95, block_size: int = 32, max_new_tokens: int = 512,
             with_ar: bool = True, show_progress: bool = True) -> EvalReport:
    """Decode every example with block diffusion, then (optionally) with AR; score both."""
    settings = {"max_new_tokens": max_new_tokens, "repetition_penalty": 1.0, "presence_penalty": 0.0,
                "frequency_penalty": 0.0}
    modes = [("block_diffusion", {"block_size": block_size, "threshold": threshold})]
    if with_ar:
        modes.append(("ar", {}))
    results = {}
    bar = tqdm(total=len(examples) * len(modes), disable=not show_progress, unit="prompt",
               desc="eval", dynamic_ncols=True)
    for mode, extra in modes:
        def progress(s: DecodeSummary, mode=mode):
            bar.update(1)
            bar.set_postfix(mode=mode, acc=f"{s.accuracy:.3f}", tps=f"{s.tokens_per_second:.0f}")
        results[mode] = decode_all(model, tokenizer, examples, mode, settings | extra, progress)
    bar.close()
    return EvalReport(model_name, task, threshold, block_size, results["block_diffusion"], results.get("ar"))


def report_lines(report: EvalReport) -> list[str]:
    d, a = report.diffusion, report.ar
    lines = [f"model {report.model}  task {report.task}  n={d.n}  block {report.block_size}  "
             f"threshold {report.threshold}"]
    lines.append(f"{'mode':<16}{'accuracy':>9}{'tok/fwd':>9}{'tok/s':>9}")
    for s in (d, a):
        if s is not None:
            lines.append(f"{s.mode:<16}{s.accuracy:>9.3f}{s.tokens_per_forward:>9.2f}{s.tokens_per_second:>9.1f}")
    if a is not None:
        lines.append(f"block diffusion / AR tokens/s: {d.tokens_per_second / max(a.tokens_per_second, 1e-9):.2f}x")
    for t, (c, n) in sorted(d.per_task.items()):
        lines.append(f"  {t:<14}{c / n:>7.3f} ({c}/{n})")
    return lines


def summary_dict(s: DecodeSummary) -> dict:
    return asdict(s)
