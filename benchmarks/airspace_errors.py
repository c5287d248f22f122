"""Where the `airspace` task's wrong answers go wrong, for block diffusion and AR decoding.

An `airspace` answer is derived in the think block, one line per zone notice in issue order that
says what became of the zone (`Z47 cancelled.`, `Z53 amended.`, `Z43 active.`; see
`clover.data.tasks.airspace`); the JSON then lists the zones left active with their fields, amended
ones with the new value. For each wrong answer this finds the first part that differs from the target:

  status   a zone's status line wrong (the modifier notice matched to the wrong zone, or missed)
  lines    the status lines do not name the target's zones in order (one missing, extra, renamed)
  zones    every status right, but the JSON lists other zones than the target
  field    the zones right, a field value wrong (split: a value an amendment replaced, or a copied one)
  json     the output is not valid JSON

    python benchmarks/airspace_errors.py --limit 40 --seed 3

Prints the first wrong part of each wrong answer, a table of kinds per decoding mode, and how the
wrong status lines confuse one status for another.

With `--teacher-forced` it decodes nothing: one pass per prompt over the target answer (the clean
prefix given) tells how often the model's most likely token is the target's, for the status word of
each line (by true status, and split by whether a modifier notice comes right after the zone's
notice: a model that pins a modifier on the notice above it gets the `active, modifier next` and
the `amended|cancelled, modifier apart` rows wrong) and for the JSON values (those an amendment replaced, and the copied ones),
causally (AR) and in block mode with the whole block masked (the first denoising step).
"""

import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

from clover.data import get_task
from clover.data.tasks.airspace import AMENDED_FIELDS
from clover.data.tasks.base import clean_output
from clover.evaluation.field_loss import teacher_forced

sys.path.insert(0, str(Path(__file__).parent))
from common import decode_task_errors, kinds_table  # noqa: E402

KINDS = ("status", "lines", "zones", "field", "json")
# after any checks; with the task option `radii`, the radius after it (`Z20 active, 800 m = 0.8 km.`);
# with `amendments`, an amended zone's notice as its status (`Z20 AMENDED: radius now 800 m.`)
_STATUS_LINE = re.compile(r"^(?:Z\d+: (?:Z\d+(?:=Z\d+)? no, )*(?:Z\d+=)?)?(Z\d+) (\w+)"
                          r"(?:, [^=]+ = [\d.]+ km|: (?:radius|window) now .+)?\.$")
_CHECK_NO = re.compile(r"(?<= )no(?=,)")  # a written check's word (task option `checks`)
_MODIFIER = re.compile(r"^NOTICE Z\d+ (CANCELLED|AMENDED)")


def status_lines(think: str) -> list[tuple[str, str]] | None:
    """`[(zone id, status)]` of a think block's lines, None if a line is not `Zxx status.` (after
    the checks `Zxx: Zyy no, ` or `Zxx: Zyy=Zxx no, Zxx=` with the task option `checks`)."""
    parsed = [_STATUS_LINE.match(line.strip()) for line in think.strip().splitlines()]
    return None if not all(parsed) else [(m[1], m[2].lower()) for m in parsed]


def value_kind(meta: dict, zone_id: str, field: str) -> str:
    """`amended` if a modifier notice replaced this field of this zone, else `copied`."""
    return "amended" if field in AMENDED_FIELDS.get(meta["modified"].get(zone_id, ""), ()) else "copied"


def first_error(output: str, example) -> tuple[str, str]:
    """`(kind, detail)` for a wrong answer `output` to an airspace `example`."""
    think = output.split("</think>")[0].replace("<think>", "") if "</think>" in output else ""
    got, want = status_lines(think), status_lines(example.reasoning)
    if got is None or [z for z, _ in got] != [z for z, _ in want]:
        return "lines", think.strip().replace("\n", " | ")
    wrong = [(z, w, g) for (z, g), (_, w) in zip(got, want) if g != w]
    if wrong:
        return "status", ", ".join(f"{z} {w}->{g}" for z, w, g in wrong)
    try:
        parsed = json.loads(clean_output(output))
    except ValueError:
        return "json", clean_output(output)[:80]
    target = example.meta["zones"]
    if not isinstance(parsed, list) or [z.get("id") if isinstance(z, dict) else None for z in parsed] \
            != [z["id"] for z in target]:
        return "zones", json.dumps(parsed)[:80]
    for zone, right in zip(parsed, target):
        for field, value in right.items():
            if zone.get(field) != value:
                kind = value_kind(example.meta, right["id"], field)
                return "field", f"{field} ({kind}) of {right['id']}: {zone.get(field)!r} for {value!r}"
    return "field", "(no field differs)"


def modifier_next(example) -> dict[str, bool]:
    """Zone id -> whether the notice right after the zone's own notice is a modifier (of any zone)."""
    notices = example.prompt.splitlines()[1:]
    is_modifier = [bool(_MODIFIER.match(line)) for line in notices] + [False]
    return {line.split()[1].rstrip(":"): is_modifier[k + 1]
            for k, line in enumerate(notices) if not is_modifier[k]}


def answer_spans(example, answer: str) -> list[tuple[str, int, int]]:
    """`(row, start, end)` character spans in `answer` (the chat answer: think block, then JSON) of
    each status word (row `status <status>`, and again under `<status>, modifier next|apart`: whether
    a modifier notice comes right after the zone's notice), each written check's `no` (row `check
    no`, with the task option `checks`) and each JSON value (row `value amended|copied`)."""
    spans, next_to = [], modifier_next(example)
    start = answer.index(example.reasoning)
    for line in example.reasoning.splitlines():
        match = _STATUS_LINE.match(line)
        zone_id, status = match[1], match[2].lower()
        at = start + match.start(2)
        spans.append((f"status {status}", at, at + len(status)))
        spans.append((f"{status}, modifier {'next' if next_to[zone_id] else 'apart'}", at, at + len(status)))
        spans += [("check no", start + m.start(), start + m.end()) for m in _CHECK_NO.finditer(line)]
        start += len(line) + 1
    start, zone_id = answer.rindex(example.answer), None
    for field, a, b in get_task("airspace").field_spans(example):
        if field == "id":
            zone_id = example.answer[a:b]
        spans.append((f"value {value_kind(example.meta, zone_id, field)}", start + a, start + b))
    return spans


def teacher_forced_table(model, tokenizer, examples) -> list[str]:
    """Token accuracy of the status words by true status and of the JSON values by kind, AR and block."""
    counts = defaultdict(lambda: [0, 0])  # (mode, row) -> [right, total] over tokens
    for example in examples:
        forced = teacher_forced(model, tokenizer, example, enable_thinking=True)
        for row, start, end in answer_spans(example, forced.answer):
            for mode, hits in forced.hits(start, end).items():
                counts[mode, row][0] += sum(hits)
                counts[mode, row][1] += len(hits)
    rows = [f"{'part':<26}{'AR tokens':>10}{'block tokens':>14}{'tokens':>8}"]
    for row in sorted({row for _, row in counts}, key=lambda r: (r.startswith("value"), r)):
        ar, block = (counts[m, row][0] / counts[m, row][1] for m in ("AR", "block"))
        rows.append(f"{row:<26}{ar:>10.3f}{block:>14.3f}{counts['AR', row][1]:>8}")
    return rows


def main() -> None:
    probe = decode_task_errors(__doc__, "airspace", teacher_forced_table)
    if probe is None:
        return
    args, task, examples, decoded = probe
    table, confusions, pinned = {}, {}, {}
    for mode, summary in decoded.items():
        kinds, confused = table[mode], confusions[mode] = Counter(), Counter()
        pinned[mode] = [0, 0]  # active zones marked modified: [right above a modifier notice, all]
        for example, text in zip(examples, summary.texts):
            if task.score(example, text)["correct"]:
                continue
            kind, detail = first_error(text, example)
            kinds[kind] += 1
            if kind == "status":
                for zone_id, change in (part.split(" ", 1) for part in detail.split(", ")):
                    confused[change] += 1
                    if change.startswith("active->"):
                        pinned[mode][0] += modifier_next(example)[zone_id]
                        pinned[mode][1] += 1
            if not args.quiet:
                print(f"{mode} {kind}: {detail}")
    print("\n" + "\n".join(kinds_table(table, len(examples), KINDS, 8)))
    print("\nwrong status lines (target->output):")
    for mode, confused in confusions.items():
        print(f"  {mode:<16}" + ", ".join(f"{k} {n}" for k, n in confused.most_common()))
    print("active zones marked modified, and of those the ones right above a modifier notice:")
    for mode, (above, marked) in pinned.items():
        print(f"  {mode:<16}{marked}, {above}")


if __name__ == "__main__":
    main()
