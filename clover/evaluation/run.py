"""Evaluate a model on held-out task prompts with block diffusion and with AR decoding, in one run
(and, when asked, with self-speculative decoding, whose text must equal AR's: C6 on real prompts).

Each prompt is decoded alone (batch of one, greedy) by default, since batch-1 latency is what block
diffusion is for; `batch_size` > 1 decodes that many prompts per `generate` call instead (rows are
independent, so the texts are those of batch one up to float rounding; the speed is then the
batch's). Accuracy comes from the tasks' exact-match scorers, with per-field counts where a task
reports them. The modes are interleaved prompt by prompt, or batch by batch (and which one goes
first alternates), so a change in machine load during the run affects them alike; timing covers
`generate` only (prefill included), summed over prompts.

Generation settings are the checkpoint's own (`generation_config.json`: threshold, block size,
penalties) and its chat template's default thinking mode; arguments override them only when given.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from clover.data import Example, format_chat, get_task
from clover.model.generation_config import resolve_config

MODES = ("block_diffusion", "ar", "self_spec")


@dataclass
class DecodeSummary:
    mode: str  # "block_diffusion", "ar" or "self_spec"
    new_tokens: int = 0
    forwards: int = 0  # decoding forwards (prefill chunks excluded)
    seconds: float = 0.0
    per_task: dict[str, list[int]] = field(default_factory=dict)  # task -> [correct, n]
    per_field: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # task -> field -> [right, n]
    texts: list[str] = field(default_factory=list, repr=False)  # each prompt's output, in order
    outcomes: list[bool] = field(default_factory=list, repr=False)  # each prompt's exact match, in order

    @property
    def n(self) -> int:
        return len(self.outcomes)

    @property
    def correct(self) -> int:
        return sum(self.outcomes)

    @property
    def accuracy(self) -> float:
        return self.correct / max(self.n, 1)

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / max(self.forwards, 1)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / max(self.seconds, 1e-9)

    def speedup_over(self, base: "DecodeSummary") -> float:
        """Tokens/s against `base`'s (the same prompts, interleaved)."""
        return self.tokens_per_second / max(base.tokens_per_second, 1e-9)

    def add(self, task: str, score: dict, tokens: int, forwards: int, seconds: float, text: str = "") -> None:
        correct = bool(score["correct"])
        self.texts.append(text)
        self.outcomes.append(correct)
        self.new_tokens += tokens
        self.forwards += forwards
        self.seconds += seconds
        counts = self.per_task.setdefault(task, [0, 0])
        counts[0] += correct
        counts[1] += 1
        fields = self.per_field.setdefault(task, {})
        for name, (right, total) in score.get("fields", {}).items():
            acc = fields.setdefault(name, [0, 0])
            acc[0] += right
            acc[1] += total

    def task_accuracy(self) -> dict[str, float]:
        return {t: c / n for t, (c, n) in self.per_task.items()}

    def field_accuracy(self) -> dict[str, dict[str, float]]:
        return {t: {f: r / n for f, (r, n) in fields.items()} for t, fields in self.per_field.items()}


@dataclass
class EvalReport:
    model: str
    task: str
    threshold: float
    block_size: int
    threads: int
    diffusion: DecodeSummary | None  # None: AR only (`with_diffusion=False`)
    ar: DecodeSummary | None
    self_spec: DecodeSummary | None = None
    thinking: bool | None = None  # whether the prompts were in thinking mode (None: no prompts)
    batch_size: int = 1  # prompts per generate call: speed figures are at this batch
    fallback: str = "confidence"  # block diffusion's rule when no position passes the threshold
    fill: str = "threshold"  # block diffusion's rule for which positions above the threshold it fills

    @property
    def self_spec_same_as_ar(self) -> int | None:
        """Prompts on which self-speculative decoding wrote exactly AR's text (C6: all of them)."""
        if self.self_spec is None or self.ar is None:
            return None
        return sum(a == b for a, b in zip(self.self_spec.texts, self.ar.texts))

    @property
    def paired_with_ar(self) -> tuple[int, int, float] | None:
        """Block diffusion against AR on the same prompts: (prompts only block diffusion gets right,
        prompts only AR gets right, the standard error of the accuracy difference). The
        difference is (first − second) / n; only these discordant prompts carry it."""
        if self.ar is None or self.diffusion is None:
            return None
        pairs = list(zip(self.diffusion.outcomes, self.ar.outcomes))
        n = max(len(pairs), 1)
        only_d = sum(d and not a for d, a in pairs)
        only_a = sum(a and not d for d, a in pairs)
        variance = (only_d + only_a - (only_d - only_a) ** 2 / n) / n ** 2
        return only_d, only_a, max(variance, 0.0) ** 0.5

    @property
    def summaries(self) -> list[DecodeSummary]:
        """The modes decoded, in report order."""
        return [s for s in (self.diffusion, self.ar, self.self_spec) if s is not None]

    def to_json(self) -> dict:
        """Block diffusion's figures unprefixed (`accuracy`, ...), AR's and self-spec's prefixed."""
        d = self.diffusion
        out = {
            "model": self.model, "task": self.task, "n": self.summaries[0].n, "threads": self.threads,
            "thinking": self.thinking, "batch_size": self.batch_size,
            "threshold": self.threshold, "block_size": self.block_size, "fallback": self.fallback,
            "fill": self.fill,
        }
        if d is not None:
            out |= {"accuracy": d.accuracy, "tokens_per_forward": d.tokens_per_forward,
                    "tokens_per_second": d.tokens_per_second,
                    "per_task_accuracy": d.task_accuracy(), "per_field_accuracy": d.field_accuracy()}
        if self.ar is not None:
            out |= {"ar_accuracy": self.ar.accuracy, "ar_tokens_per_second": self.ar.tokens_per_second,
                    "ar_per_task_accuracy": self.ar.task_accuracy(),
                    "ar_per_field_accuracy": self.ar.field_accuracy()}
        if self.paired_with_ar is not None:
            only_d, only_a, se = self.paired_with_ar
            out |= {"speedup_vs_ar": d.speedup_over(self.ar),
                    "only_diffusion_correct": only_d, "only_ar_correct": only_a, "paired_difference_se": se}
        if self.self_spec is not None:
            s = self.self_spec
            out |= {"self_spec_accuracy": s.accuracy, "self_spec_tokens_per_forward": s.tokens_per_forward,
                    "self_spec_tokens_per_second": s.tokens_per_second,
                    "self_spec_same_as_ar": self.self_spec_same_as_ar}
            if self.ar is not None:
                out["self_spec_speedup_vs_ar"] = s.speedup_over(self.ar)
        return out


def prompt_batch(model, tokenizer, examples: Sequence[Example], enable_thinking: bool | None = None):
    """The examples' chat-formatted prompts, tokenized and left-padded on the model's device:
    `input_ids` and `attention_mask` [N, T]."""
    prompts = [format_chat(tokenizer, e, enable_thinking=enable_thinking).prompt for e in examples]
    return tokenizer(prompts, return_tensors="pt", add_special_tokens=False, padding=True,
                     padding_side="left").to(model.device)


def prompt_ids(model, tokenizer, example: Example, enable_thinking: bool | None = None) -> torch.Tensor:
    """The example's chat-formatted prompt as token ids [1, T] on the model's device."""
    return prompt_batch(model, tokenizer, [example], enable_thinking).input_ids


def decode_one(model, tokenizer, example: Example, mode: str, settings: dict,
               enable_thinking: bool | None = None) -> tuple[str, int, int, float]:
    """(text, new tokens, decoding forwards, seconds) for one prompt, greedy, batch of one."""
    return decode_batch(model, tokenizer, [example], mode, settings, enable_thinking)[0]


def decode_batch(model, tokenizer, examples: Sequence[Example], mode: str, settings: dict,
                 enable_thinking: bool | None = None) -> list[tuple[str, int, int, float]]:
    """`decode_one` for several prompts in one greedy `generate` call (left-padded): each row's
    text, new tokens and decoding forwards, and an equal share of the call's seconds."""
    batch = prompt_batch(model, tokenizer, examples, enable_thinking)
    width = batch.input_ids.shape[1]
    start = time.perf_counter()
    out = model.generate(**batch, mode=mode, do_sample=False, return_dict_in_generate=True, **settings)
    share = (time.perf_counter() - start) / len(examples)
    return [(tokenizer.decode(out.response_ids(row, width), skip_special_tokens=False), stats.new_tokens,
             stats.num_forwards - out.num_prefill_forwards, share) for row, stats in enumerate(out.rows)]


def decode_all(model, tokenizer, examples: Sequence[Example], modes: dict[str, dict],
               enable_thinking: bool | None = None, progress=None, batch_size: int = 1) -> dict[str, DecodeSummary]:
    """Decode every example in every mode of `modes` (mode -> generate settings), `batch_size`
    prompts per call, interleaved batch by batch with the first mode alternating; score each output."""
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be at least 1")
    summaries = {mode: DecodeSummary(mode) for mode in modes}
    tasks = {name: get_task(name) for name in {e.task for e in examples}}  # each task's scorer, built once
    order = list(modes)
    for i, first in enumerate(range(0, len(examples), batch_size)):
        chunk = examples[first:first + batch_size]
        for mode in (order if i % 2 == 0 else order[::-1]):
            rows = decode_batch(model, tokenizer, chunk, mode, modes[mode], enable_thinking)
            for example, (text, tokens, forwards, seconds) in zip(chunk, rows):
                score = tasks[example.task].score(example, text)
                summaries[mode].add(example.task, score, tokens, forwards, seconds, text)
        if progress is not None:
            progress(summaries, len(chunk))
    return summaries


@torch.inference_mode()
def evaluate(model, tokenizer, examples: Sequence[Example], *, model_name: str = "", task: str = "all",
             threshold: float | None = None, block_size: int | None = None, max_new_tokens: int = 512,
             with_ar: bool = True, enable_thinking: bool | None = None,
             show_progress: bool = True, with_self_spec: bool = False, batch_size: int = 1,
             with_diffusion: bool = True, fallback: str | None = None, fill: str | None = None) -> EvalReport:
    """Decode every example with block diffusion, AR and self-speculative decoding (drafts of
    `block_size`), each optional, interleaved, `batch_size` prompts per call; score each.
    `threshold` / `block_size` / `fallback` / `fill` default to the checkpoint's generation config."""
    if not (with_diffusion or with_ar or with_self_spec):
        raise ValueError("with_diffusion, with_ar and with_self_spec are all False: no mode to decode")
    cfg = resolve_config(model.generation_config, model.config, dict(threshold=threshold, block_size=block_size,
                                                                     fallback=fallback, fill=fill))
    threshold, block_size, fallback, fill = cfg.threshold, cfg.block_size, cfg.fallback, cfg.fill
    modes = {}
    if with_diffusion:
        modes["block_diffusion"] = {"max_new_tokens": max_new_tokens, "block_size": block_size,
                                    "threshold": threshold, "fallback": fallback, "fill": fill}
    if with_ar:
        modes["ar"] = {"max_new_tokens": max_new_tokens}
    if with_self_spec:
        modes["self_spec"] = {"max_new_tokens": max_new_tokens, "block_size": block_size}
    bar = tqdm(total=len(examples), disable=not show_progress, unit="prompt", desc="eval",
               dynamic_ncols=True)

    def progress(summaries, done):
        bar.update(done)
        bar.set_postfix({f"{m[:2]}_acc": f"{s.accuracy:.2f}" for m, s in summaries.items() if m != "self_spec"}
                        | {f"{m[:2]}_tok/fwd": f"{s.tokens_per_forward:.1f}" for m, s in summaries.items()
                           if m != "ar"})

    results = decode_all(model, tokenizer, examples, modes, enable_thinking, progress, batch_size)
    bar.close()
    thinking = format_chat(tokenizer, examples[0], enable_thinking).answer.startswith("<think>") if examples else None
    return EvalReport(model_name, task, threshold, block_size, torch.get_num_threads(),
                      results.get("block_diffusion"), results.get("ar"), results.get("self_spec"), thinking,
                      batch_size, fallback, fill)


def report_lines(report: EvalReport) -> list[str]:
    d, a = report.diffusion, report.ar
    summaries = report.summaries
    lines = [f"model {report.model}  task {report.task}  n={summaries[0].n}  block {report.block_size}  "
             f"threshold {report.threshold}  fill {report.fill}  fallback {report.fallback}  "
             f"thinking {'on' if report.thinking else 'off'}  "
             f"threads {report.threads}  " + ("(modes interleaved per prompt)" if report.batch_size == 1 else
                                              f"batch {report.batch_size}  (modes interleaved per batch)")]
    lines.append(f"{'mode':<16}{'accuracy':>9}{'tok/fwd':>9}{'tok/s':>9}")
    for s in summaries:
        lines.append(f"{s.mode:<16}{s.accuracy:>9.3f}{s.tokens_per_forward:>9.2f}{s.tokens_per_second:>9.1f}")
    if report.paired_with_ar is not None:
        lines.append(f"block diffusion / AR tokens/s: {d.speedup_over(a):.2f}x")
        only_d, only_a, se = report.paired_with_ar
        lines.append(f"block diffusion - AR accuracy: {d.accuracy - a.accuracy:+.3f} (standard error {se:.3f}): "
                     f"right where AR is wrong on {only_d}, wrong where AR is right on {only_a} prompts")
    if report.self_spec is not None and a is not None:
        s = report.self_spec
        lines.append(f"self-spec / AR tokens/s: {s.speedup_over(a):.2f}x; "
                     f"text equal to AR's on {report.self_spec_same_as_ar}/{s.n} prompts")
    scored = [s for s in (d, a) if s is not None] or summaries  # the table's columns
    titles = {"block_diffusion": "diffusion", "ar": "AR", "self_spec": "self-spec"}
    lines.append(f"{'task / field':<22}" + "".join(f"{titles[s.mode]:>10}" for s in scored))
    first = scored[0]
    for t, (c, n) in sorted(first.per_task.items()):
        lines.append(f"  {t:<20}" + "".join(f"{s.task_accuracy()[t]:>10.3f}" for s in scored) + f"   ({c}/{n})")
        for f in first.per_field.get(t, {}):
            cells = []
            for s in scored:
                right, total = s.per_field.get(t, {}).get(f, (0, 0))
                cells.append(f"{right / total:>10.3f}" if total else f"{'-':>10}")
            lines.append(f"    .{f:<17}" + "".join(cells))
    return lines
