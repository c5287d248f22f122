"""``joint``: rules + facts about pilots, then 2..4 linked yes/no questions answered at once.

World: 3 base properties (drawn from ``BASE``) and 2 derived properties (from
``DERIVED``; ``max_rules=3`` allows a third). Each derived property has one rule,
"Anyone who is A and B is D." (or a single condition) over the base properties; with
``chain=True`` a rule's conditions include the previous derived property, so rules chain.
Up to ``max_questions`` (at most 8) questions. Facts give each pilot a subset of the base properties. Closed world: a
pilot has a property only if a fact states it or a rule derives it.

Questions ask "Is <pilot> <property>?" for distinct (pilot, property) pairs, sorted by
pilot then property order, so a derived question usually follows the questions it
depends on; answers therefore constrain each other (if 1:no and rule needs it, 2 is no).

Reasoning (the think block): one line per question that copies the question, then what
decides it, then answers: the pilot's fact line, for a derived property the rule(s) behind
it, and ``yes``/``no``: ``2. Is Kim cleared? Kim is rested. Anyone who is licensed and
rested is cleared. no``. Each step is one lookup: the question by its number, the fact line
by the name just copied, the rule by the property just copied; the answer is a check of the
rule against the fact line written just before it, so a small model can follow it.

With ``checks`` (a training option, off by default) each line also writes the check out before the
answer: each condition (the asked base property, or the rule's conditions in order) against the fact
line's properties one by one, until it is found or the line ends, and no further once a condition
fails. The answer is then the last check's, so no step needs the whole fact line at once (without
the checks the model learns to answer by the line's length). Four layouts:
``checks="listed"``: ``4. Is Mia cleared? Mia is licensed and rested. Anyone who is insured and
rested is cleared. insured: licensed no, rested no. no`` (each property compared with the condition
written a few tokens before); ``checks="paired"``: ``... cleared. licensed=insured no, rested=insured
no. no`` (each property written next to the condition, so that the comparison is of two tokens
within the model's short convolution when it predicts the next token causally); ``checks="signed"``:
``... cleared. licensed=insured-, rested=insured-. no`` (the check a sign glued to the pair). Block
mode predicts a token at its own position, one token later than causal mode does, so its
convolution window ends one token later; with a space token between the pair and its word (paired)
the first property falls out of that window, with the sign glued on (signed) both modes' windows
hold both properties (the window turned out not to be what holds block mode back: BENCHMARKS.md).
``checks="signed_all"`` checks every condition against every stated property, so how many checks a
line writes does not depend on their outcomes (in the other layouts a condition's checks stop at its
match, and block mode learns to read a check's outcome from where they stop); the answer is then yes
when every condition has a "+".

With ``facts="roster"`` (the default is ``"counted"``, below; ``"stated"`` writes the closed-world
sentences above) the prompt lists every pilot's value of every base property, ``Kim: licensed=no,
rested=yes, registered=yes.``, as a roster does, and each line looks up the conditions it needs in the
copied roster line before the answer: ``2. Is Kim cleared? Kim: licensed=no, rested=yes, registered=yes.
Anyone who is licensed and rested is cleared. licensed=no, rested=yes. no`` (a base property:
``rested=yes. yes``). Each lookup copies the value that follows the condition in the line just written,
and the answer is yes when every looked-up value is; no step has to notice that a word is missing from a
line.

With ``facts="named"`` the roster names the pilot at each value, ``Kim licensed=no, Kim rested=yes,
Kim registered=yes.``, and a line copies no fact line: after the question and the rule(s) it looks each
condition up by pilot and property, ``2. Is Kim cleared? Anyone who is licensed and rested is cleared.
Kim licensed=no, Kim rested=yes. no`` (a base property: ``Kim rested=yes. yes``). In the stated form a
copy's later words are found by the words before them alone (past a line's first property no layer of
the shipped model holds whose line a word is in: BENCHMARKS.md), so it slips into another line that
shares them; here every lookup has its pilot two words back. With ``facts="marked"`` (under ``Roster (+
yes, - no):``) each value is a sign glued to its property, ``Kim licensed-, Kim rested+.``, so that the
pilot, the property and the value lie within the short convolution's four tokens (a space is a token).
Measured from the shipped model, the lookup by pilot and property is learned slowly: with copy
supervision 0.87 of the values are right after 2,000 steps, and joint decodes worse than in the
stated form (BENCHMARKS.md, "Joint's facts as a roster that names the pilot at each value").

With ``facts="counted"`` (the default) each fact line gives how many properties it states, then which,
where the stated form writes ``is``: ``Kim 2 licensed and rested.``, ``Kim 1 rested.``, ``Kim 0.``
(under ``Facts (how many, then which; nothing else is true):``), in the prompt and in each line's copy.
In the stated form a copy's list length is decided at the separator after its first property, by a
lookup that finds the words just written in the prompt, and no layer of the shipped model holds there
whose line they are in: 42 of its 79 wrong copies of seed 8 go wrong at that separator (BENCHMARKS.md,
"The fact lines follow a shared word"). Counted, the length is looked up right after the name, where the
stated form's ``is`` and first property are looked up without fault, and each separator follows from the
count two tokens back. The first property is looked up as far from the name as in the stated form.
Measured from the shipped stated-form model, the copies were right 0.98 of the time after 2,500 steps
(0.87 stated), and the verdicts then failed instead on two-property lines under two-condition rules,
where the stated rule repeats the fact line's words after the same ``is`` (BENCHMARKS.md, "Joint's fact
lines say how many before which").

With ``rules="keyed"`` (the default is ``"sentence"``) each rule is written with its derived property
first, as a list of requirements is, ``cleared: licensed and rested.`` in place of ``Anyone who is
licensed and rested is cleared.``; with ``facts="keyed"`` each fact line names the pilot the same
way, ``Kim: licensed and rested.`` (``Kim: none.`` when nothing is stated). A derivation line copies
the rule by the property it asks about: in the sentence form the conditions come before that
property, so the copy has to find them from the end of their line; keyed, the property is the
token right before the conditions, as the name is before a fact line's properties, so each copy
follows its key. ``2. Is Kim cleared? Kim: rested. cleared: licensed and rested. no``. Measured from
the embedded model's stage 14, the keyed forms copied no better (BENCHMARKS.md, "Two more stages").

With ``line_rules="keyed"`` (a training option; by default a line writes its rule in the prompt's form)
the derivation line writes the rule it copies property first while the prompt keeps its sentences:
``2. Is Kim cleared? Kim is rested. cleared: licensed and rested. no``. The line writes the asked
property again just before the conditions, so the position that writes the first condition holds
what the lookup matches (in the sentence form it is a question and a fact line back, and the embedded
model's residual stream there does not hold it: ``benchmarks/lookup_probe.py``), while the prompt's
rule still holds its conditions at its property word, where the lookup reads them. Measured from
the embedded model, both are then held and no head looks from one to the other: the rules are copied
worse (BENCHMARKS.md, "Where joint's rule lookup fails").

With ``line_rules="both"`` the line writes the rule keyed and then in the prompt's sentence form:
``2. Is Kim cleared? Kim is rested. cleared: licensed and rested. Anyone who is licensed and rested is
cleared. no``. The keyed copy is the lookup (its key right before it, as with ``"keyed"``), the
sentence is a copy of the copy just written, and the verdict then comes four words after the last
condition, where the sentence form's model makes the check (``benchmarks/verdict_probe.py``); with
keyed lines alone it comes right after the conditions and is answered by the fact line's length.
Measured from the embedded model with a fitted lookup layer, the keyed copies are then right and the
verdict is not: it leans to "no" (BENCHMARKS.md, "Keyed rule, then its sentence").

With ``line_rules="keyed_first"`` the keyed copy comes before the fact line and the sentence after it:
``2. Is Kim cleared? cleared: licensed and rested. Kim is rested. Anyone who is licensed and rested is
cleared. no``. The keyed copy's key is then a copy of the question's last word, and the fact line stays
right before the sentence rule and the verdict, as in the default lines the embedded model checks well.
Measured with a fitted lookup layer, the keyed copies and the verdicts are then right, and the
sentence copy and the fact line slip (BENCHMARKS.md, "Keyed rule before the fact line").
``line_rules="keyed_before_fact"`` writes the keyed copy before the fact line and no sentence: ``2. Is
Kim cleared? cleared: licensed and rested. Kim is rested. no``, so the verdict follows the fact line,
its conditions one line back. Measured from the embedded model, that verdict leans to "no" (BENCHMARKS.md,
"The fact lines follow a shared word").

With ``derive="scan"`` (a training option; the default ``"lookup"`` writes the rule behind the
property) a derived line copies the rules in prompt order up to and including the one behind the
property: ``2. Is Kim cleared? Kim is rested. Anyone who is insured and rested is qualified. Anyone
who is licensed and rested is cleared. no``. The lookup copies a rule found by its last word, which
the rule's first words cannot see in causal order (the embedded model copies it right 30 times in
44, BENCHMARKS.md, "A drill for joint's rule lookup"); the scan copies the first rule, then the one
after the rule just copied, and each stop is a comparison of the word just written with the
question's property. Measured from the embedded model, the scan copies a passed rule's conditions
but writes the question's property as its conclusion, and joint answers no better (BENCHMARKS.md,
"A scan of the rules").

With ``ask_derived=False`` (a training option; derived properties are asked by default) every question
asks a base property: the rules are still given, but no line needs them, so each answer is one check
of the fact line.

With ``min_people`` (a training option; 1 by default) a prompt has at least that many pilots, up
to 3: the fact-line lookups that fail are those among several lines (BENCHMARKS.md, "Stage 19 on
one H200"). The default draws exactly as before the option existed.

With ``balanced`` (a training option, off by default) each question is drawn so that its answer
is yes or no with equal odds, whatever the pilot's fact line holds. Drawn uniformly, a base property
asked of a pilot with one stated property is "no" two times in three, and with two "yes" two times
in three, so a model can answer by the length of the fact line instead of checking it.

With ``hard_verdicts`` (a training option, 0 by default) that share of prompts is redrawn until one of
its derived questions has the answer a fact line's length does not give: "yes" from a pilot with one
stated property (the rule's one condition), or "no" from one with two (a condition missing). Balanced
or not, these are about one derived question in four (one in two at ``hard_verdicts=0.5``), and the
models of the keyed-rule lineage answer them by the length: "no" to one stated property, "yes" to two
(``joint_errors.py --teacher-forced``).
At 0 the draws are exactly those from before the option existed.

Answer: one line ``1:yes 2:no 3:yes``. Scoring parses ``<n>:yes|no`` pairs (first
occurrence of each number counts): ``item_accuracy`` = right items / questions,
``correct`` iff every item is right and no other numbers were answered.
"""

from __future__ import annotations

import random
import re
from typing import Any

from clover.data.tasks.base import CHECK_LAYOUTS, Example, Task, check_count_range, check_layout, clean_output
from clover.data.tasks.vocab import FIRST_NAMES

MIN_QUESTIONS, MAX_QUESTIONS = 2, 8
MAX_PEOPLE = 3  # pilots in a prompt
INSTRUCTION = "Answer every question with yes or no, all on one line."

BASE: tuple[str, ...] = ("licensed", "insured", "trained", "registered", "certified", "rested")
DERIVED: tuple[str, ...] = ("approved", "cleared", "eligible", "authorized", "qualified")
_CHECK_LAYOUTS = (*CHECK_LAYOUTS, "signed", "signed_all")  # joint writes its checks in two more layouts
# the prompt's facts, by form, under their heading: closed-world sentences (counted or not), keyed lines, or every
# value listed
_CLOSED_WORLD = "Facts (nothing else is true):"
_FACT_HEADINGS = {"stated": _CLOSED_WORLD, "counted": "Facts (how many, then which; nothing else is true):",
                  "keyed": _CLOSED_WORLD, "roster": "Roster:", "named": "Roster:", "marked": "Roster (+ yes, - no):"}
_NAMED = ("named", "marked")  # roster forms that name the pilot at each value: `Kim rested=yes` or `Kim rested+`
_LOOKED_UP = ("roster", *_NAMED)  # fact forms whose lines look each condition's value up
RULE_FORMS = ("sentence", "keyed")  # "Anyone who is a and b is d." or "d: a and b."
LINE_RULE_FORMS = (*RULE_FORMS, "both", "keyed_first", "keyed_before_fact")  # a derivation line may also
# write "d: a and b. Anyone who is a and b is d." after its fact line, the keyed rule before the fact line and
# the sentence after it, or the keyed rule before the fact line alone
_KEYED_LINES = ("both", "keyed_first", "keyed_before_fact")  # line forms that write the looked-up rule keyed
_KEYED_BEFORE_FACT = ("keyed_first", "keyed_before_fact")  # line forms that write it right after the question
DERIVATIONS = ("lookup", "scan")  # a derived line copies the rule behind it, or every rule up to it
_SIGN = {True: "+", False: "-"}
_PAIR = re.compile(r"(\d+)\s*:\s*(yes|no)\b", re.IGNORECASE)

Rule = tuple[str, tuple[str, ...]]  # (derived property, conditions)


class JointTask(Task):
    """Joint yes/no decisions under shared rules (see module docstring)."""

    name = "joint"

    def __init__(self, min_questions: int = MIN_QUESTIONS, max_questions: int = 4, max_rules: int = 2,
                 chain: bool = False, reasoning: bool = True, balanced: bool = False, checks: str = "",
                 facts: str = "counted", rules: str = "sentence", ask_derived: bool = True,
                 min_people: int = 1, derive: str = "lookup", line_rules: str | None = None,
                 hard_verdicts: float = 0.0):
        check_count_range("questions", min_questions, max_questions, least=MIN_QUESTIONS, most=MAX_QUESTIONS)
        if not 1 <= min_people <= MAX_PEOPLE:
            raise ValueError(f"min_people must be 1..{MAX_PEOPLE}, got {min_people}")
        if max_rules not in (2, 3):
            raise ValueError(f"max_rules must be 2 or 3, got {max_rules}")
        if check_layout(checks, reasoning, _CHECK_LAYOUTS) and chain:
            raise ValueError(f"checks={checks!r} needs chain=False (a chained condition is not in the fact "
                             f"line), got chain=True")
        if facts not in _FACT_HEADINGS:
            raise ValueError(f"facts={facts!r} must be one of {tuple(_FACT_HEADINGS)}")
        if facts in _LOOKED_UP and (chain or checks):
            raise ValueError(f"facts={facts!r} writes its own lookups of base properties: it needs "
                             f"chain=False and checks='', got chain={chain}, checks={checks!r}")
        line_rules = line_rules or rules
        if facts in _NAMED and line_rules in _KEYED_LINES:
            raise ValueError(f"facts={facts!r} lines copy no fact line to write a keyed rule around: it needs "
                             f"line_rules in {RULE_FORMS}, got line_rules={line_rules!r}")
        for option, form, forms in (("rules", rules, RULE_FORMS), ("line_rules", line_rules, LINE_RULE_FORMS)):
            if form not in forms:
                raise ValueError(f"{option}={form!r} must be one of {forms}")
        if line_rules in _KEYED_LINES and (rules != "sentence" or derive != "lookup"):
            raise ValueError(f"line_rules={line_rules!r} writes the looked-up rule keyed next to the prompt's "
                             f"sentences: it needs rules='sentence' and derive='lookup', got rules={rules!r}, "
                             f"derive={derive!r}")
        if not 0.0 <= hard_verdicts <= 1.0:
            raise ValueError(f"hard_verdicts is a share of prompts, 0..1, got {hard_verdicts}")
        if hard_verdicts and not ask_derived:
            raise ValueError(f"hard_verdicts redraws until a derived question misleads: it needs ask_derived=True, "
                             f"got hard_verdicts={hard_verdicts} with ask_derived=False")
        if derive not in DERIVATIONS:
            raise ValueError(f"derive={derive!r} must be one of {DERIVATIONS}")
        if {"keyed", *_KEYED_LINES} & {rules, line_rules, facts} and checks:
            raise ValueError(f"keyed rules or facts are written without checks (a keyed line reads like a "
                             f"listed check), got rules={rules!r}, line_rules={line_rules!r}, facts={facts!r}, "
                             f"checks={checks!r}")
        self.min_questions = min_questions
        self.max_questions = max_questions
        self.max_rules = max_rules
        self.chain = chain
        self.reasoning = reasoning  # write the think-block derivation (else an empty think block)
        self.balanced = balanced
        self.checks = checks  # write each condition's check against the fact line before the answer
        self.facts = facts
        self.rules = rules
        self.line_rules = line_rules  # the form of the rules a derivation line writes
        self.ask_derived = ask_derived  # else every question asks a base property
        self.min_people = min_people  # pilots in a prompt: at least this many (and enough for the questions)
        self.derive = derive
        self.hard_verdicts = hard_verdicts  # share of prompts redrawn until a verdict defies the fact line's length

    def sample(self, rng: random.Random) -> Example:
        hard = self.hard_verdicts and rng.random() < self.hard_verdicts  # no draw at 0: defaults unchanged
        example = self._draw(rng)
        while hard and not any(_length_misleads(example)):
            example = self._draw(rng)
        return example

    def _draw(self, rng: random.Random) -> Example:
        base = rng.sample(BASE, 3)
        rules = draw_rules(rng, base, self.max_rules, self.chain)
        props = base + [d for d, _ in rules]
        askable = len(props) if self.ask_derived else len(base)  # props[:askable] may be asked
        n_q = rng.randint(self.min_questions, self.max_questions)
        n_people = rng.randint(max(-(-n_q // askable), self.min_people), MAX_PEOPLE)
        people = rng.sample(FIRST_NAMES, n_people)
        facts = draw_facts(rng, people, base)
        truth = {p: _closure(facts[p], rules) for p in people}
        every = [(i, j) for i in range(n_people) for j in range(askable)]
        if self.balanced:
            pairs = _balanced_pairs(rng, every, lambda i, j: props[j] in truth[people[i]], len(base), n_q)
        else:
            pairs = rng.sample(every, n_q)
        pairs.sort()
        questions = [(people[i], props[j]) for i, j in pairs]
        answers = [prop in truth[p] for p, prop in questions]
        prompt = render(rules, people, facts, base, questions, self.facts, self.rules)
        answer = " ".join(f"{k}:{_yn(a)}" for k, a in enumerate(answers, 1))
        derived = [prop in dict(rules) for _, prop in questions]
        stated = [len(facts[p]) for p, _ in questions]
        reasoning = "\n".join(
            self._derivation_line(k, p, prop, a, facts[p], base, rules)
            for k, ((p, prop), a) in enumerate(zip(questions, answers), 1)) if self.reasoning else ""
        return Example(prompt, answer, self.name, {"answers": answers, "derived": derived, "stated": stated},
                       reasoning)

    def _derivation_line(self, k: int, pilot: str, prop: str, answer: bool, held: set[str],
                         base: list[str], rules: list[Rule]) -> str:
        """``2. Is Kim cleared? Kim is rested. Anyone who is licensed and rested is cleared. no``:
        the question, the fact line, the rule(s) behind the property, [the checks,] the answer."""
        behind = _rules_behind(prop, rules)
        conditions = behind[0][1] if behind else (prop,)
        written = behind  # the scan writes every rule in prompt order, up to the last one behind
        if self.derive == "scan" and behind:
            written = rules[:rules.index(behind[-1]) + 1]
        question, fact = f"{k}. Is {pilot} {prop}?", fact_line(pilot, held, base, self.facts)
        if self.facts in _NAMED:  # each lookup names its pilot: no fact line is copied
            words = [question, *(rule_line(rule, self.line_rules) for rule in written)]
        elif self.line_rules in _KEYED_BEFORE_FACT:  # the keyed lookup right after the question
            words = [question, *(rule_line(rule, "keyed") for rule in written), fact]
            if self.line_rules == "keyed_first":  # and its sentence after the fact line
                words += [rule_line(rule, "sentence") for rule in written]
        else:
            words = [question, fact, *(rule_line(rule, self.line_rules) for rule in written)]
        if self.facts in _LOOKED_UP:
            words.append(_values(conditions, held, pilot if self.facts in _NAMED else "", self.facts == "marked"))
        elif self.checks:
            words.append(_checks([b for b in base if b in held], conditions, self.checks))
        return " ".join(w for w in [*words, _yn(answer)] if w)

    def field_spans(self, example: Example) -> list[tuple[str, int, int]]:
        """``(field, start, end)`` spans of the yes/no words in ``example.answer``."""
        return field_spans(example)

    def score(self, example: Example, output_text: str) -> dict[str, Any]:
        target: list[bool] = example.meta["answers"]
        given: dict[int, bool] = {}
        for number, word in _PAIR.findall(clean_output(output_text)):
            given.setdefault(int(number), word.lower() == "yes")
        hits = [given.get(k) == a for k, a in enumerate(target, 1)]
        right = sum(hits)
        extra = set(given) - set(range(1, len(target) + 1))
        derived = example.meta.get("derived", [False] * len(target))
        fields = {"fact": [0, 0], "derived": [0, 0]}  # questions about stated vs derived properties
        for hit, is_derived in zip(hits, derived):
            field = fields["derived" if is_derived else "fact"]
            field[0] += hit
            field[1] += 1
        return {
            "correct": right == len(target) and not extra,
            "item_accuracy": right / len(target),
            "n_items": len(target),
            "fields": {k: v for k, v in fields.items() if v[1]},
        }


def field_spans(example: Example) -> list[tuple[str, int, int]]:
    derived = example.meta.get("derived", [False] * len(example.meta["answers"]))
    return [("derived" if is_derived else "fact", m.start(2), m.end(2))
            for m, is_derived in zip(_PAIR.finditer(example.answer), derived)]


def length_misleads(answer: bool, stated: int) -> bool:
    """Whether a verdict is other than the fact line's length suggests: yes from two or more stated
    properties, no from fewer."""
    return answer != (stated >= 2)


def _length_misleads(example: Example) -> list[bool]:
    """Per question: a derived verdict that the fact line's length misleads (`length_misleads`)."""
    meta = example.meta
    return [derived and length_misleads(answer, stated)
            for derived, answer, stated in zip(meta["derived"], meta["answers"], meta["stated"])]


def _balanced_pairs(rng: random.Random, every: list[tuple[int, int]], holds, n_base: int,
                    n_q: int) -> list[tuple[int, int]]:
    """``n_q`` distinct (pilot, property) index pairs out of ``every``: each draws a pilot, then a
    kind (base or derived, as often as a uniform draw of that pilot's properties would), then yes or
    no with equal odds while both are left, then a property; ``holds(i, j)`` is the answer."""
    left, pairs = list(every), []
    for _ in range(n_q):
        pilot = rng.choice(sorted({i for i, _ in left}))
        derived = rng.choice([j for i, j in left if i == pilot]) >= n_base
        kind = [(i, j) for i, j in left if i == pilot and (j >= n_base) == derived]
        answer = rng.choice(sorted({holds(i, j) for i, j in kind}))
        pair = rng.choice([(i, j) for i, j in kind if holds(i, j) == answer])
        left.remove(pair)
        pairs.append(pair)
    return pairs


def draw_facts(rng: random.Random, people: list[str], base: list[str]) -> dict[str, set[str]]:
    """{pilot: the base properties its fact line states}, each stated with probability 0.55."""
    return {p: {b for b in base if rng.random() < 0.55} for p in people}


def draw_rules(rng: random.Random, base: list[str], max_rules: int, chain: bool) -> list[Rule]:
    """2..max_rules rules; each derives a new property from 1..2 base properties, or with
    ``chain`` from known ones including the previous derived property (a chain)."""
    known = list(base)
    rules: list[Rule] = []
    for derived in rng.sample(DERIVED, rng.randint(2, max_rules)):
        k = rng.choice((1, 2, 2))
        conds = rng.sample(known, k)
        if chain and rules and rules[-1][0] not in conds:
            conds[0] = rules[-1][0]
        rules.append((derived, tuple(sorted(set(conds), key=known.index))))
        if chain:
            known.append(derived)
    return rules


def _closure(facts: set[str], rules: list[Rule]) -> set[str]:
    """Everything true for one pilot; rules are ordered so one pass suffices."""
    true = set(facts)
    for derived, conds in rules:
        if all(c in true for c in conds):
            true.add(derived)
    return true


def _rules_behind(prop: str, rules: list[Rule]) -> list[Rule]:
    """The rules that decide ``prop``, in rule order: its own rule and, through chained
    conditions, the rules of the derived properties it needs (none for a base property)."""
    by_derived = dict(rules)
    needed, todo = set(), [prop]
    while todo:
        p = todo.pop()
        if p in by_derived and p not in needed:
            needed.add(p)
            todo.extend(by_derived[p])
    return [(d, conds) for d, conds in rules if d in needed]


def rule_line(rule: Rule, form: str) -> str:
    """The rule in ``form`` (``LINE_RULE_FORMS``): ``d: a and b.``, ``Anyone who is a and b is d.``, or both."""
    derived, conds = rule
    keyed, sentence = f"{derived}: {_join(conds)}.", f"Anyone who is {_join(conds)} is {derived}."
    return {"keyed": keyed, "sentence": sentence, "both": f"{keyed} {sentence}"}[form]


def _checks(held_in_order: list[str], conditions: tuple[str, ...], layout: str) -> str:
    """Each condition against the stated properties in order until found, stopping after the first
    condition not found (``signed_all``: every condition against every stated property); empty when
    nothing is stated. Except in signed_all, the answer is then the last check's word. Stated
    licensed and insured, conditions insured and rested: ``insured: licensed no, insured yes. rested:
    licensed no, insured no.``, paired ``licensed=insured no, insured=insured yes. licensed=rested no,
    insured=rested no.``, or signed (here also signed_all) ``licensed=insured-, insured=insured+.
    licensed=rested-, insured=rested-.``."""
    if not held_in_order:
        return ""
    stops = layout != "signed_all"  # at a condition's match, and after a condition not found
    lines = []
    for condition in conditions:
        found = condition in held_in_order
        tried = held_in_order[:held_in_order.index(condition) + 1] if stops and found else held_in_order
        checks = ", ".join(_check(held, condition, layout) for held in tried)
        lines.append(f"{condition}: {checks}." if layout == "listed" else f"{checks}.")
        if stops and not found:
            break
    return " ".join(lines)


def _check(held: str, condition: str, layout: str) -> str:
    if layout == "listed":
        return f"{held} {_yn(held == condition)}"
    if layout in ("signed", "signed_all"):
        return f"{held}={condition}{_SIGN[held == condition]}"
    return f"{held}={condition} {_yn(held == condition)}"


def _values(properties: list[str] | tuple[str, ...], held: set[str], pilot: str = "", marked: bool = False) -> str:
    """``licensed=no, rested=yes.``: each property with its value, as a roster line writes it; with
    ``pilot``, each value named: ``Kim licensed=no, Kim rested=yes.``; ``marked``, each value a sign
    glued to its property: ``Kim licensed-, Kim rested+.``."""
    named = f"{pilot} " if pilot else ""
    return ", ".join(f"{named}{prop}{_value(prop in held, marked)}" for prop in properties) + "."


def _value(holds: bool, marked: bool) -> str:
    """``=yes`` / ``=no``, or marked ``+`` / ``-``."""
    return _SIGN[holds] if marked else f"={_yn(holds)}"


def fact_line(person: str, held: set[str], base: list[str], form: str) -> str:
    if form == "roster":
        return f"{person}: {_values(base, held)}"
    if form in _NAMED:
        return _values(base, held, person, form == "marked")
    held_in_order = [b for b in base if b in held]
    if form == "keyed":
        return f"{person}: {_join(held_in_order) if held_in_order else 'none'}."
    if form == "counted":
        return f"{person} {len(held_in_order)} {_join(held_in_order)}." if held_in_order else f"{person} 0."
    return f"{person} is {_join(held_in_order)}." if held_in_order else f"{person} has none of these."


def render(
    rules: list[Rule],
    people: list[str],
    facts: dict[str, set[str]],
    base: list[str],
    questions: list[tuple[str, str]],
    form: str,
    rule_form: str,
    instruction: str = INSTRUCTION,
) -> str:
    """The prompt: the rules, the facts (in ``form``), the numbered questions, then ``instruction``."""
    rule_lines = [rule_line(rule, rule_form) for rule in rules]
    fact_lines = [fact_line(p, facts[p], base, form) for p in people]
    q_lines = [f"{k}. Is {p} {prop}?" for k, (p, prop) in enumerate(questions, 1)]
    return "\n".join(
        ["Rules:", *rule_lines, _FACT_HEADINGS[form], *fact_lines,
         "Questions:", *q_lines, instruction]
    )


def _join(words: list[str] | tuple[str, ...]) -> str:
    """``[a] -> "a"``, ``[a, b] -> "a and b"``, ``[a, b, c] -> "a, b and c"``."""
    words = list(words)
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def split_joined(text: str) -> list[str]:
    """``"a, b and c" -> ["a", "b", "c"]``: the words ``_join`` joined."""
    return text.replace(",", " and").split(" and ")


def _yn(value: bool) -> str:
    return "yes" if value else "no"
