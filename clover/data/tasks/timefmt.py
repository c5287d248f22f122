"""Times of day as minutes since midnight, and the wordings tasks use for them.

Canonical output form is ``HH:MM`` (24 h, zero padded). The input wordings avoid
am/pm so a tiny model only has to copy and re-punctuate digits.
"""

from __future__ import annotations

import random

STEP_MINUTES = 15


def hhmm(minutes: int) -> str:
    """``485 -> "08:05"`` (canonical form used in answers)."""
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def compact(minutes: int) -> str:
    """``485 -> "0805"`` (NOTAM-like form)."""
    return f"{minutes // 60:02d}{minutes % 60:02d}"


def loose(minutes: int) -> str:
    """``485 -> "8:05"`` (hour without leading zero)."""
    return f"{minutes // 60}:{minutes % 60:02d}"


N_WINDOW_FORMS = 4


def window_phrase(rng: random.Random, start: int, end: int, forms: int = N_WINDOW_FORMS) -> str:
    """One of the first ``forms`` (of four) wordings of the window ``[start, end]``."""
    wordings = (
        f"{compact(start)}-{compact(end)}",
        f"{hhmm(start)} to {hhmm(end)}",
        f"from {loose(start)} until {loose(end)}",
        f"between {compact(start)} and {compact(end)}",
    )
    return rng.choice(wordings[:forms])


def sample_window(rng: random.Random, min_len: int = 30, max_len: int = 360) -> tuple[int, int]:
    """A same-day window on the 15-minute grid, ``min_len <= end - start <= max_len``."""
    length = rng.randrange(min_len, max_len + 1, STEP_MINUTES)
    start = rng.randrange(0, 24 * 60 - length, STEP_MINUTES)
    return start, start + length
