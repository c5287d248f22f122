"""``copy``: repeat a line of domain text exactly (a curriculum task, not an evaluation task).

Prompt: an instruction line, then one line of 6..24 fragments drawn from the other tasks'
vocabulary (pilot names, places, drone models, zone and flight ids, times, radii, coordinates,
a few plain words). Answer: that line, verbatim.

Copying prompt spans into an answer is what every evaluation task needs (names, ids, times);
learning it here first, where nothing else has to be learned, is the "pure copying" stage of
the embedded model's curriculum (induction before role-based retrieval). ``curriculum = True``
keeps it out of ``EVAL_TASKS`` and of the default mixtures.
"""

from __future__ import annotations

import random
from typing import Any

from clover.data.tasks import timefmt
from clover.data.tasks.base import Example, Task, check_count_range, clean_output
from clover.data.tasks.vocab import DRONE_MODELS, FIRST_NAMES, PLACES, PURPOSES, SURNAMES

INSTRUCTION = "Repeat the following text exactly."
_WORDS = ("zone", "radius", "pilot", "flight", "notice", "window", "altitude", "site", "active",
          "cancelled", "amended", "yes", "no", "and", "at", "for", "from", "to", "km", "m")


def _fragment(rng: random.Random) -> str:
    kind = rng.randrange(9)
    if kind == 0:
        return f"{rng.choice(FIRST_NAMES)} {rng.choice(SURNAMES)}"
    if kind == 1:
        return rng.choice(PLACES)
    if kind == 2:
        return f"{rng.choice(DRONE_MODELS)}-{rng.randint(1, 9)}"
    if kind == 3:
        return rng.choice((f"Z{rng.randint(10, 99)}", f"F{rng.randint(100, 999)}"))
    if kind == 4:
        return timefmt.hhmm(rng.randrange(0, 24 * 60, 15))
    if kind == 5:
        return rng.choice((f"{rng.randint(3, 80) / 10}", f"{rng.randint(3, 80) * 100}", str(rng.randint(10, 999))))
    if kind == 6:
        return f"{rng.randint(20, 45)}.{rng.randint(0, 99):02d}N {rng.randint(100, 125)}.{rng.randint(0, 99):02d}E"
    if kind == 7:
        return rng.choice(PURPOSES)
    return rng.choice(_WORDS)


class CopyTask(Task):
    """Verbatim copy of a line of domain fragments (see module docstring)."""

    name = "copy"
    curriculum = True

    def __init__(self, min_fragments: int = 6, max_fragments: int = 24):
        check_count_range("fragments", min_fragments, max_fragments)
        self.min_fragments, self.max_fragments = min_fragments, max_fragments

    def sample(self, rng: random.Random) -> Example:
        n = rng.randint(self.min_fragments, self.max_fragments)
        separator = rng.choice((" ", ", ", "; "))
        line = separator.join(_fragment(rng) for _ in range(n))
        return Example(INSTRUCTION + "\n" + line, line, self.name, {})

    def score(self, example: Example, output_text: str) -> dict[str, Any]:
        return {"correct": clean_output(output_text) == example.answer}
