"""``record``: rewrite a key=value flight record as a fixed two-sentence briefing.

Prompt: an instruction line, then the record ``key=value; key=value; ...`` with the
keys in the record schema's order (``shuffle_keys=True``: random order). Values are written exactly as the answer needs them
(times already ``HH:MM``), so the job is reordering and copying, which a tiny model
can learn, while the answer stays long (typically 45-60 tokens with a 3k vocab):

    Flight F123: pilot Ana Li flies Hawk-4 at Harbor Park for inspection.
    It runs from 08:00 to 11:30 at 120 m altitude.

(one line; the two sentences are separated by a single space). Scoring is exact match
after stripping surrounding whitespace and end tokens; ``token_overlap`` gives the
fraction of answer words found at the same position, as a softer signal.
"""

from __future__ import annotations

import random
import re
from typing import Any

from clover.data.tasks import timefmt
from clover.data.tasks.base import Example, Task, clean_output
from clover.data.tasks.vocab import DRONE_MODELS, FIRST_NAMES, PLACES, PURPOSES, SURNAMES

INSTRUCTION = "Rewrite this flight record as a briefing."
_TEMPLATE = (
    "Flight {flight}: pilot {pilot} flies {drone} at {site} for {purpose}. "
    "It runs from {start} to {end} at {altitude} m altitude."
)


_FIELD_PATTERN = re.compile(
    re.escape(_TEMPLATE).replace(r"\{", "{").replace(r"\}", "}")
    .format(**{k: f"(?P<{k}>.+?)" for k in ("flight", "pilot", "drone", "site", "purpose", "start",
                                            "end", "altitude")}) + "$")


def _field_scores(output: str, fields: dict[str, str]) -> dict[str, list[int]]:
    """``[right, 1]`` per record field, read back by matching ``output`` against the template
    (a field counts as wrong when the output does not follow the template)."""
    match = _FIELD_PATTERN.match(output)
    return {k: [int(match is not None and match.group(k) == v), 1] for k, v in fields.items()}


class RecordTask(Task):
    """Flight record to briefing text (see module docstring)."""

    name = "record"

    def __init__(self, shuffle_keys: bool = False):
        self.shuffle_keys = shuffle_keys

    def sample(self, rng: random.Random) -> Example:
        start, end = timefmt.sample_window(rng)
        fields = {
            "flight": f"F{rng.randint(100, 999)}",
            "pilot": f"{rng.choice(FIRST_NAMES)} {rng.choice(SURNAMES)}",
            "drone": f"{rng.choice(DRONE_MODELS)}-{rng.randint(1, 9)}",
            "site": rng.choice(PLACES),
            "purpose": rng.choice(PURPOSES),
            "start": timefmt.hhmm(start),
            "end": timefmt.hhmm(end),
            "altitude": str(rng.randrange(30, 130, 10)),
        }
        keys = list(fields)  # the briefing's order, as a fixed-schema record lists them
        if self.shuffle_keys:
            rng.shuffle(keys)
        record = "; ".join(f"{k}={fields[k]}" for k in keys)
        answer = _TEMPLATE.format(**fields)
        return Example(INSTRUCTION + "\n" + record, answer, self.name, {"fields": fields})

    def field_spans(self, example: Example) -> list[tuple[str, int, int]]:
        """``(field, start, end)`` character spans of the record values in ``example.answer``."""
        match = _FIELD_PATTERN.match(example.answer)
        return [(k, match.start(k), match.end(k)) for k in example.meta["fields"]]

    def score(self, example: Example, output_text: str) -> dict[str, Any]:
        got = clean_output(output_text)
        want_words, got_words = example.answer.split(), got.split()
        same = sum(a == b for a, b in zip(want_words, got_words))
        return {
            "correct": got == example.answer,
            "token_overlap": same / max(len(want_words), len(got_words)),
            "fields": _field_scores(got, example.meta["fields"]),
        }
