"""The contract every synthetic task follows, and the split rule they share.

A task turns ``(seed, split)`` into one ``Example`` and scores a model's output text.

Determinism: ``generate(seed, split)`` seeds a private ``random.Random`` from the string
``"{name}|{split}|{seed}|{attempt}"`` (string seeds hash through SHA-512 in CPython, so
this is stable across processes and ``PYTHONHASHSEED``). Same arguments, same example.

Disjoint splits: the split an example belongs to is a property of its prompt,
``split_of(prompt)``: the SHA-256 of the prompt modulo ``SPLIT_MODULUS`` is ``0`` for
``eval`` and anything else for ``train``. ``generate`` re-draws (``attempt`` += 1) until
the sampled prompt belongs to the requested split, so no prompt can ever appear in both
splits, whatever seeds are used. About 1 in ``SPLIT_MODULUS`` draws is eval, so eval
generation costs ``SPLIT_MODULUS`` draws on average and train about 1.1.
"""

from __future__ import annotations

import abc
import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

SPLITS: tuple[str, ...] = ("train", "eval")
CHECK_LAYOUTS: tuple[str, ...] = ("", "listed", "paired")  # a task's `checks` option: none, or how
# the think block writes each check (joint, airspace: their module docstrings); joint adds two more
SPLIT_MODULUS = 10
_MAX_ATTEMPTS = 10_000


@dataclass(frozen=True)
class Example:
    """One task instance. ``prompt`` is the user message text; ``answer`` the exact
    target completion (no chat tokens); ``meta`` holds task-specific structured data
    (e.g. the parsed target) that scorers may use. ``reasoning`` is the think-block text
    a model writes before the answer in thinking mode (a step-by-step derivation that
    only copies from the prompt and decides; empty when the task has none)."""

    prompt: str
    answer: str
    task: str
    meta: dict[str, Any] = field(default_factory=dict)
    reasoning: str = ""


def check_count_range(name: str, low: int, high: int, least: int = 1, most: int | None = None) -> None:
    """Refuse a task's `min_<name>`..`max_<name>` option pair unless `least <= low <= high` (and
    `high <= most`), naming both options and the values given."""
    if not least <= low <= high or (most is not None and high > most):
        limit = "" if most is None else f" <= {most}"
        raise ValueError(f"need {least} <= min_{name} <= max_{name}{limit}, got {low}..{high}")


def split_of(prompt: str) -> str:
    """The split that owns ``prompt``: ``"eval"`` or ``"train"`` (pure function of text)."""
    digest = hashlib.sha256(prompt.encode("utf-8")).digest()
    return "eval" if int.from_bytes(digest[:8], "big") % SPLIT_MODULUS == 0 else "train"


class Task(abc.ABC):
    """A deterministic example generator with its scorer.

    Subclasses set ``name`` and implement ``sample`` (draw one example from ``rng``
    ignoring splits) and ``score``.
    """

    name: str = ""
    curriculum: bool = False  # a training-only stage (kept out of evaluation and default mixtures)

    def generate(self, seed: int, split: str) -> Example:
        """The example for ``(seed, split)``; its prompt always satisfies ``split_of``."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        for attempt in range(_MAX_ATTEMPTS):
            example = self.sample(random.Random(f"{self.name}|{split}|{seed}|{attempt}"))
            if split_of(example.prompt) == split:
                return example
        raise RuntimeError(f"{self.name}: no {split} example after {_MAX_ATTEMPTS} draws")

    @abc.abstractmethod
    def sample(self, rng: random.Random) -> Example:
        """Draw one example using only ``rng`` for randomness."""

    def field_spans(self, example: Example) -> list[tuple[str, int, int]]:
        """``(field, start, end)`` character spans of the answer's fields in ``example.answer``
        (for per-field diagnostics); none by default."""
        return []

    @abc.abstractmethod
    def score(self, example: Example, output_text: str) -> dict[str, Any]:
        """Score ``output_text`` against ``example``. Never raises on malformed output;
        the result holds at least ``{"correct": bool}``."""


def clean_output(output_text: str) -> str:
    """Strip what a model may emit around an answer: a leading think block, end tokens
    and surrounding whitespace. A think block that never closes leaves no answer (as the server
    returns it: everything is reasoning, the content is empty)."""
    text = output_text
    if "</think>" in text:
        text = text.split("</think>", 1)[1]
    elif text.lstrip().startswith("<think>"):
        return ""
    for stop in ("<|im_end|>", "<|endoftext|>"):
        text = text.split(stop, 1)[0]
    return text.strip()


def check_layout(checks: str, reasoning: bool, layouts: tuple[str, ...] = CHECK_LAYOUTS) -> str:
    """A task's ``checks`` option, validated: one of the task's ``layouts``, and only with reasoning
    on (the checks are written in the think block)."""
    if checks not in layouts:
        raise ValueError(f"checks={checks!r} must be one of {layouts}")
    if checks and not reasoning:
        raise ValueError(f"checks={checks!r} needs reasoning=True (the checks are written in the think block)")
    return checks
