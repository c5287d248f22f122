"""``airspace``: free-text drone airspace notices -> JSON list of active no-fly zones.

Prompt: an instruction line, then ``n`` notices (``min_notices <= n <= max_notices``,
at most 20), one per line, as a notice feed would list them. ``m <= n // 2`` of them modify
an earlier zone: ``NOTICE Zxx CANCELLED`` (zone dropped) or ``NOTICE Zxx AMENDED: radius
now ...`` / ``... window now ...`` (that field replaced). A modifier always comes after the
notice it modifies (not necessarily right after), and each zone gets at most one. With
``modifiers_last`` (a training option, 0 by default) that share of prompts lists every modifier
after the last new zone, in random order, as a feed that publishes its amendments in a batch does:
placed anywhere, about three modifiers in four come right after their own zone, so a model can
learn to pin a modifier on the notice above it instead of on the zone its id names.

Answer: compact JSON (no spaces), the active zones in the order their notices were issued,
keys in the order ``id, location, radius_km, start, end``; ``radius_km`` has one decimal, times are
``HH:MM``. ``[]`` when every zone is cancelled.

Unit choice (kept learnable for a ~5M-parameter model): radii are tenths of a km in
``[0.3, 8.0]``, written either in km (``2.5 km`` / ``2.5 kilometres`` / ``2.5km``; whole
values without ``.0``) or in metres (``2500 m`` / ``2500 metres``), where metres -> km
is a pure shift of the decimal point. Nautical miles (``x NM``, km = NM * 1.852
rounded half-up to 0.1) need real arithmetic, so they are off unless
``nautical_miles=True``. Locations are named places or coordinates written the same way
in prompt and answer (``31.24N 121.47E``), so they are copied verbatim.

Reasoning (the think block): one line per zone in the order its notice was issued,
saying what became of it: ``Z68 cancelled.``, ``Z20 amended.`` or ``Z56 active.``.
So the decision to drop a cancelled zone is written down before the JSON is. With ``checks``
(a training option, off by default) each line first checks the notices after the zone's own, in
order, against the zone's id, until its modifier, so no step has to find a zone's modifier anywhere
in the feed at once (without it the model learns to pin a modifier on the notice above it). Two
layouts: ``checks="listed"``: ``Z13: Z17 no, Z13 amended.``, ``Z17: Z13 no, Z17 active.``,
``Z20: Z20 active.`` (each id compared with the one at the line's start); ``checks="paired"``:
``Z13: Z17=Z13 no, Z13=Z13 amended.``, ``Z17: Z13=Z17 no, Z17 active.`` (each id written next to
the zone's).

With ``radii`` (a training option, off by default) the line of each zone left active (or amended)
also writes its radius, first as its notice words it, then in km as the JSON will: ``Z56 active,
2500 metres = 2.5 km.``, ``Z20 amended, 800 m = 0.8 km.``, ``Z31 active, 3km = 3.0 km.``. Metres to km
is a shift of the decimal point that depends on how many digits the number has; written right after
the number, the shift is read off the few tokens just written instead of a number found in the
feed, and the JSON's radius then copies the km value from its zone's line. Measured from the
embedded model's stage 14, 1,500 steps did not learn the lines, and they cost the copies after them
(BENCHMARKS.md, "Two more stages").

With ``amendments`` (a training option, off by default) an amended zone's line is its amendment
notice copied without ``NOTICE``: ``Z20 AMENDED: radius now 800 m.`` instead of ``Z20 amended.``.
The copy starts right after the two tokens it shares with one notice (``Z20 AMENDED:``), the lookup
an induction head does, and the JSON then reads the new value from the nearby line instead of
finding the amendment among the notices, where the zone's own notice offers the old value.
Measured from the trailing-space lineage's anneal export, 4,793 steps with the lines scored below
3,972 steps without (airspace 0.765 against 0.815): the answers went wrong elsewhere (BENCHMARKS.md,
"Amendment notices copied into the reasoning").

Scoring: the output is parsed as JSON; ``correct`` iff the parsed value equals the
target (order included). Malformed JSON scores ``correct=False, valid_json=False``.
``zone_f1`` gives partial credit over exactly matching zones.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from clover.data.tasks import timefmt
from clover.data.tasks.base import Example, Task, check_count_range, check_layout, clean_output
from clover.data.tasks.vocab import PLACES

MAX_NOTICES = 20
INSTRUCTION = "Read the airspace notices and list the active no-fly zones as JSON."

_ZONE_TEMPLATES: tuple[str, ...] = (  # the first `wordings` of them are used
    "NOTICE {id}: Temporary no-fly zone at {loc} ({r} radius), {t}.",
    "NOTICE {id} - {loc}: restricted airspace, radius {r}, {t}.",
    "NOTICE {id}: No drone flights within {r} of {loc}, {t}.",
    "NOTICE {id}: UAV operations prohibited in a {r} radius around {loc}, {t}.",
    "NOTICE {id}: {loc} closed to drones out to {r}, {t}.",
)
_CANCEL_TEMPLATES: tuple[str, ...] = (
    "NOTICE {id} CANCELLED.",
    "NOTICE {id} CANCELLED, zone released.",
)
_RADIUS_TEMPLATE = "NOTICE {id} AMENDED: radius now {r}."
_WINDOW_TEMPLATE = "NOTICE {id} AMENDED: window now {t}."
_STATUS = {"cancel": "cancelled", "radius": "amended", "window": "amended"}  # modifier kind -> status


@dataclass
class _Zone:
    """Mutable working state of one zone while a prompt is being built."""

    id: str
    location: str
    radius_tenths: int
    start: int
    end: int
    radius_text: str = ""  # the radius as the latest notice that gave it words it
    modifier: str = ""  # the notice that cancelled or amended the zone, if one did

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "location": self.location,
            "radius_km": self.radius_tenths / 10,
            "start": timefmt.hhmm(self.start),
            "end": timefmt.hhmm(self.end),
        }


class AirspaceTask(Task):
    """Drone airspace notices to no-fly-zone JSON (see module docstring)."""

    name = "airspace"

    def __init__(self, min_notices: int = 1, max_notices: int = 4, nautical_miles: bool = False,
                 wordings: int = 1, time_forms: int = 2, reasoning: bool = True, modifiers_last: float = 0.0,
                 checks: str = "", radii: bool = False, amendments: bool = False):
        check_count_range("notices", min_notices, max_notices, most=MAX_NOTICES)
        if not 1 <= wordings <= len(_ZONE_TEMPLATES):
            raise ValueError(f"wordings={wordings} must be in 1..{len(_ZONE_TEMPLATES)}")
        if not 1 <= time_forms <= timefmt.N_WINDOW_FORMS:
            raise ValueError(f"time_forms={time_forms} must be in 1..{timefmt.N_WINDOW_FORMS}")
        if not 0.0 <= modifiers_last <= 1.0:
            raise ValueError(f"modifiers_last={modifiers_last} must be in [0, 1]")
        self.min_notices = min_notices
        self.max_notices = max_notices
        self.nautical_miles = nautical_miles
        self.templates = _ZONE_TEMPLATES[:wordings]
        self.time_forms = time_forms
        self.reasoning = reasoning  # write each zone's fate in the think block (else an empty one)
        self.modifiers_last = modifiers_last
        self.checks = check_layout(checks, reasoning)  # check later notices' ids before each status
        if radii and self.checks:
            raise ValueError(f"radii=True writes no checks, got checks={checks!r}")
        self.radii = radii  # write each listed zone's radius as worded and in km after its status
        if amendments and radii:
            raise ValueError("amendments=True and radii=True both rewrite an amended zone's line; pick one")
        self.amendments = amendments  # an amended zone's line copies its amendment notice

    def sample(self, rng: random.Random) -> Example:
        n = rng.randint(self.min_notices, self.max_notices)
        n_mods = rng.randint(0, n // 2)
        zones = self._zones(rng, n - n_mods)
        feed = [(z.id, self._zone_line(rng, z)) for z in zones]  # (zone id, notice line)
        modified: dict[str, str] = {}  # zone id -> "cancel" | "radius" | "window"
        # (no draw when the option is off, so that default prompts stay those of every earlier seed)
        last = self.modifiers_last > 0 and rng.random() < self.modifiers_last
        for zone in rng.sample(zones, n_mods):  # each modifier lands somewhere after its zone
            after = len(zones) if last else [zone_id for zone_id, _ in feed].index(zone.id) + 1
            kind, line = self._modify(rng, zone)
            modified[zone.id] = kind
            zone.modifier = line
            feed.insert(rng.randint(after, len(feed)), (zone.id, line))
        lines = [line for _, line in feed]
        target = [z.as_json() for z in zones if z.radius_tenths > 0]
        prompt = INSTRUCTION + "\n" + "\n".join(lines)
        answer = json.dumps(target, separators=(",", ":"), ensure_ascii=False)
        ids = [zone_id for zone_id, _ in feed]
        reasoning = "\n".join(self._status_line(z, ids, modified) for z in zones) if self.reasoning else ""
        return Example(prompt, answer, self.name, {"zones": target, "n_notices": n, "modified": modified},
                       reasoning)

    def _status_line(self, zone: _Zone, ids: list[str], modified: dict[str, str]) -> str:
        """``Z20 amended.``; with radii, a listed zone's radius after it: ``Z20 amended, 800 m = 0.8
        km.``; with amendments, an amended zone's notice: ``Z20 AMENDED: radius now 800 m.``; with
        checks, the ids of the notices after the zone's own, up to its modifier, first: ``Z20: Z31
        no, Z20 amended.`` or paired ``Z20: Z31=Z20 no, Z20=Z20 amended.`` (``ids``: each notice's
        zone id, in order)."""
        zone_id = zone.id
        status = f"{zone_id} {_STATUS.get(modified.get(zone_id), 'active')}"
        if self.radii and zone.radius_tenths > 0:
            return f"{status}, {zone.radius_text} = {zone.radius_tenths / 10} km."
        status += "."
        if self.amendments and _STATUS.get(modified.get(zone_id)) == "amended":
            status = zone.modifier.removeprefix("NOTICE ")
        if not self.checks:
            return status
        later = ids[ids.index(zone_id) + 1:]
        found = zone_id in later
        pair = f"={zone_id}" if self.checks == "paired" else ""
        checks = "".join(f"{other}{pair} no, " for other in (later[:later.index(zone_id)] if found else later))
        if pair and found:  # the modifier's own check: `Z20=Z20 amended.`
            checks += f"{zone_id}="
        return f"{zone_id}: {checks}{status}"

    def score(self, example: Example, output_text: str) -> dict[str, Any]:
        target = example.meta["zones"]
        try:
            parsed = json.loads(clean_output(output_text))
        except ValueError:
            parsed = None
        fields = _field_scores(parsed if isinstance(parsed, list) else [], example.meta)
        if not isinstance(parsed, list):
            return {"correct": False, "valid_json": parsed is not None, "zone_f1": 0.0, "fields": fields}
        return {"correct": parsed == target, "valid_json": True, "zone_f1": _zone_f1(parsed, target),
                "fields": fields}

    def field_spans(self, example: Example) -> list[tuple[str, int, int]]:
        """``(field, start, end)`` character spans of the values in ``example.answer``."""
        return [(m.group(1), m.start(2), m.end(2)) for m in _VALUE.finditer(example.answer)]

    # -- drawing ---------------------------------------------------------------

    def _zones(self, rng: random.Random, k: int) -> list[_Zone]:
        ids = rng.sample(range(10, 100), k)
        places = rng.sample(PLACES, k)
        zones = []
        for i, place in zip(ids, places):
            loc = _coordinates(rng) if rng.random() < 0.25 else place
            start, end = timefmt.sample_window(rng)
            zones.append(_Zone(f"Z{i}", loc, rng.randint(3, 80), start, end))
        return zones

    def _zone_line(self, rng: random.Random, zone: _Zone) -> str:
        template = rng.choice(self.templates)
        r = self._radius_phrase(rng, zone)
        t = timefmt.window_phrase(rng, zone.start, zone.end, self.time_forms)
        return template.format(id=zone.id, r=r, loc=zone.location, t=t)

    def _modify(self, rng: random.Random, zone: _Zone) -> tuple[str, str]:
        """Apply one random modifier to ``zone``; return its kind and notice line.
        A cancelled zone is marked by ``radius_tenths = 0``."""
        kind = rng.choice(("cancel", "radius", "window"))
        if kind == "cancel":
            zone.radius_tenths = 0
            return kind, rng.choice(_CANCEL_TEMPLATES).format(id=zone.id)
        if kind == "radius":
            old = zone.radius_tenths
            zone.radius_tenths = rng.choice([r for r in range(3, 81) if r != old])
            return kind, _RADIUS_TEMPLATE.format(id=zone.id, r=self._radius_phrase(rng, zone))
        old_window = (zone.start, zone.end)
        while (zone.start, zone.end) == old_window:
            zone.start, zone.end = timefmt.sample_window(rng)
        t = timefmt.window_phrase(rng, zone.start, zone.end, self.time_forms)
        return kind, _WINDOW_TEMPLATE.format(id=zone.id, t=t)

    def _radius_phrase(self, rng: random.Random, zone: _Zone) -> str:
        """Word the zone's radius; with nautical miles on, may first redraw the radius
        so that it is exactly what the NM value rounds to."""
        kind = rng.choice(("km", "km", "m", "nm") if self.nautical_miles else ("km", "km", "m"))
        if kind == "nm":
            nm_tenths = rng.randint(2, 43)
            zone.radius_tenths = (nm_tenths * 1852 + 500) // 1000
            zone.radius_text = f"{_tenths_text(nm_tenths)} NM"
        elif kind == "m":
            zone.radius_text = rng.choice(("{} m", "{} metres")).format(zone.radius_tenths * 100)
        else:
            km = _tenths_text(zone.radius_tenths)
            zone.radius_text = rng.choice(("{} km", "{} kilometres", "{}km")).format(km)
        return zone.radius_text


def _tenths_text(tenths: int) -> str:
    """``25 -> "2.5"``, ``30 -> "3"`` (whole values lose the ``.0``)."""
    return str(tenths // 10) if tenths % 10 == 0 else f"{tenths // 10}.{tenths % 10}"


def _coordinates(rng: random.Random) -> str:
    """A point like ``31.24N 121.47E`` (two decimals, northern/eastern hemisphere)."""
    lat = rng.randint(2000, 4599)
    lon = rng.randint(10000, 12599)
    return f"{lat // 100}.{lat % 100:02d}N {lon // 100}.{lon % 100:02d}E"


FIELDS = ("id", "location", "radius_km", "start", "end")
AMENDED_FIELDS = {"radius": ("radius_km",), "window": ("start", "end")}  # modifier kind -> fields it replaces
_VALUE = re.compile(r'"(id|location|radius_km|start|end)":"?([^",}]*)')


def _field_scores(parsed: list[Any], meta: dict[str, Any]) -> dict[str, list[int]]:
    """Per-field ``[right, total]`` counts. Target zones are matched to output zones by ``id``
    (an unmatched zone gets every field wrong); ``amended`` counts the fields a modifier
    replaced, ``cancelled`` the cancelled zones left out, ``no_extra`` output zones that
    match no target zone."""
    by_id = {z.get("id"): z for z in parsed if isinstance(z, dict)}
    counts = {name: [0, 0] for name in (*FIELDS, "amended", "cancelled", "no_extra")}
    for zone in meta["zones"]:
        got = by_id.get(zone["id"], {})
        for name in FIELDS:
            right = name in got and got[name] == zone[name]
            counts[name][0] += right
            counts[name][1] += 1
            if name in AMENDED_FIELDS.get(meta.get("modified", {}).get(zone["id"], ""), ()):
                counts["amended"][0] += right
                counts["amended"][1] += 1
    for zone_id, kind in meta.get("modified", {}).items():
        if kind == "cancel":
            counts["cancelled"][0] += zone_id not in by_id
            counts["cancelled"][1] += 1
    wanted = {z["id"] for z in meta["zones"]}
    counts["no_extra"] = [sum(zone_id in wanted for zone_id in by_id), len(by_id)]
    return {k: v for k, v in counts.items() if v[1]}


def _canonical(zone: Any) -> str:
    """Order-free text key for a zone; numbers compare as floats (``3 == 3.0``)."""
    if isinstance(zone, dict):
        zone = {k: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
                for k, v in zone.items()}
    return json.dumps(zone, sort_keys=True, ensure_ascii=False)


def _zone_f1(parsed: list[Any], target: list[dict[str, Any]]) -> float:
    """F1 over exactly matching zones (multiset); 1.0 when both are empty."""
    if not parsed and not target:
        return 1.0
    hits = sum((Counter(map(_canonical, parsed)) & Counter(map(_canonical, target))).values())
    if hits == 0:
        return 0.0
    precision, recall = hits / len(parsed), hits / len(target)
    return 2 * precision * recall / (precision + recall)
