"""Per-field loss on held-out prompts: which parts of an answer a model has not learned yet.

Each answer token is labelled with the task field whose characters it overlaps (`Task.field_spans`:
an airspace zone's id, location, radius, times; a record's values; a joint answer's yes/no) or
"template" (keys, punctuation, fixed words). Two losses per token, both through the inference path
(`clover.training.loss.stream_logits`, teacher-forced clean prefix):

  * ar:   causal next-token cross-entropy (what AR decoding sees);
  * diff: block-mode cross-entropy with the token's whole block masked (the first denoising step of
          block diffusion, the hardest one: what it must know before anything of the block is filled).

Reported as mean nats per token for each (task, field).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field as dataclass_field
from functools import cached_property

import torch
import torch.nn.functional as F

from clover.data import Example, format_chat, get_task
from clover.data.tokenizer import IM_END


@dataclass
class FieldLoss:
    ar: float = 0.0  # summed nats
    diff: float = 0.0
    tokens: int = 0

    def means(self) -> dict[str, float]:
        n = max(self.tokens, 1)
        return {"ar": self.ar / n, "diff": self.diff / n, "tokens": self.tokens}


def token_fields(task, example: Example, answer_text: str, offsets: Sequence[tuple[int, int]]) -> list[str]:
    """The field of each answer token (`answer_text` holds `example.answer` after a chat prefix)."""
    shift = answer_text.rindex(example.answer)  # the answer follows any think block
    spans = [(name, a + shift, b + shift) for name, a, b in task.field_spans(example)]
    think = answer_text.find(example.reasoning) if example.reasoning else -1
    if 0 <= think < shift:  # the think block's text (thinking mode)
        spans.append(("reasoning", think, think + len(example.reasoning)))
    return [next((name for name, a, b in spans if start < b and end > a), "template")
            for start, end in offsets]


@dataclass
class TeacherForced:
    """One example's answer under teacher forcing: its text, each token's character span in it, the
    target ids [n] and two logits [n, vocab]: causal (`ar`) and block mode with every block masked
    (`diff`); `alone` maps a token index to whether block mode predicts it right when it is the
    only masked position (the last denoising step), for the tokens it was asked for."""

    answer: str
    offsets: list[tuple[int, int]]
    targets: torch.Tensor
    ar: torch.Tensor
    diff: torch.Tensor
    alone: dict[int, bool] = dataclass_field(default_factory=dict)

    @cached_property
    def right(self) -> dict[str, list[bool]]:
        """Per mode ("AR", "block"): whether each token's argmax is its target (computed on first
        use: `field_losses` needs only the logits)."""
        return {mode: (logits.argmax(-1) == self.targets).tolist()
                for mode, logits in (("AR", self.ar), ("block", self.diff))}

    def tokens(self, start: int, end: int) -> list[int]:
        """The indices of the tokens overlapping characters [start, end) of the answer."""
        return [k for k, (a, b) in enumerate(self.offsets) if a < end and b > start]

    def hits(self, start: int, end: int) -> dict[str, list[bool]]:
        """Per mode ("AR", "block", and "alone" where every token of the span was measured alone):
        whether each token overlapping characters [start, end) of the answer is predicted right
        (argmax)."""
        inside = self.tokens(start, end)
        hits = {mode: [right[k] for k in inside] for mode, right in self.right.items()}
        if inside and all(k in self.alone for k in inside):
            hits["alone"] = [self.alone[k] for k in inside]
        return hits


@torch.inference_mode()
def teacher_forced(model, tokenizer, example: Example, block_size: int | None = None,
                   enable_thinking: bool | None = None,
                   alone: Sequence[tuple[int, int]] = ()) -> TeacherForced:
    """The logits of both modes on `example`'s chat-formatted answer, given the clean prefix
    (`block_size` defaults to the checkpoint's generation config, else 32). Each token overlapping a
    character span [start, end) of the answer in `alone` is also predicted in block mode with only
    itself masked (one forward per token)."""
    from clover.training.data import Pair, collate
    from clover.training.loss import stream_logits

    block_size = block_size or getattr(model.generation_config, "block_size", 32)
    eos = tokenizer.convert_tokens_to_ids(IM_END)
    pad = tokenizer.pad_token_id
    chat = format_chat(tokenizer, example, enable_thinking=enable_thinking)
    prompt = tokenizer(chat.prompt, add_special_tokens=False).input_ids
    answer = tokenizer(chat.answer, add_special_tokens=False, return_offsets_mapping=True)
    batch = collate([Pair(tuple(prompt), tuple(answer.input_ids))], block_size, eos, pad, (eos, pad))
    batch = batch.to(model.device)
    noisy = batch.response_ids.masked_fill(batch.target_mask, model.config.mask_token_id)  # every block masked
    logits = stream_logits(model, batch, noisy, block_size)
    n = len(answer.input_ids)
    forced = TeacherForced(chat.answer, list(answer["offset_mapping"]), batch.response_ids[0, :n],
                           logits.ar[0, :n].float(), logits.diff[0, :n].float())
    for k in sorted({k for start, end in alone for k in forced.tokens(start, end)}):
        noisy = batch.response_ids.clone()
        noisy[0, k] = model.config.mask_token_id
        diff = stream_logits(model, batch, noisy, block_size).diff[0, k]
        forced.alone[k] = bool(diff.argmax() == batch.response_ids[0, k])
    return forced


def field_losses(model, tokenizer, examples: Sequence[Example], block_size: int | None = None,
                 enable_thinking: bool | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """{task: {field: {"ar": nats, "diff": nats, "tokens": n}}} over `examples` (one at a time)."""
    sums: dict[str, dict[str, FieldLoss]] = {}
    tasks: dict[str, object] = {}
    for example in examples:
        task = tasks.setdefault(example.task, get_task(example.task))
        forced = teacher_forced(model, tokenizer, example, block_size, enable_thinking)
        fields = token_fields(task, example, forced.answer, forced.offsets)
        ce_ar = F.cross_entropy(forced.ar, forced.targets, reduction="none")
        ce_diff = F.cross_entropy(forced.diff, forced.targets, reduction="none")
        per_task = sums.setdefault(example.task, {})
        for field, ar, diff in zip(fields, ce_ar.tolist(), ce_diff.tolist()):
            acc = per_task.setdefault(field, FieldLoss())
            acc.ar += ar
            acc.diff += diff
            acc.tokens += 1
    return {t: {f: acc.means() for f, acc in fields.items()} for t, fields in sums.items()}


def field_loss_lines(losses: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    lines = [f"{'task / field':<22}{'AR nats':>9}{'block nats':>11}{'tokens':>8}"]
    for task, fields in sorted(losses.items()):
        lines.append(f"  {task}")
        for field, m in sorted(fields.items(), key=lambda kv: -kv[1]["diff"]):
            lines.append(f"    .{field:<17}{m['ar']:>9.3f}{m['diff']:>11.3f}{m['tokens']:>8}")
    return lines
