"""Which part of the model writes another line's word into joint's fact-line (or rule) copies.

`fact_copies.py` finds that most wrong copies go on as another pilot's prompt line goes on after the
same words (`Mia is licensed` + `.`, from `Fay is licensed.`). This takes every such site in the
copies: a token after the name and at least one property word, where another prompt line has
written the same tokens so far and goes on differently (the rival). At each site, teacher-forced
and causal (AR: block mode masks the words before the site where they share its block), the margin
is the logit of the right token minus the rival's.

Then it removes one part of the model at a time and measures the margins again: each attention
head and each Gated DeltaNet value head (its slice of the output projection's input set to zero),
and each layer's MoE output (zero). A part that writes the rival's word raises the margin where the
copy is wrong when removed; a part the copy needs lowers it where the copy is right. The table gives
per part the mean margin change and how many sites change side, for the wrong and the right sites.

With `--lines rule` the sites are in the rule copies instead (`Anyone who is insured is approved.`,
looked up by the asked property): a token where another prompt rule has written the same tokens so
far and goes on differently (`Anyone who is` + ` certified`, from the other rule).

    python benchmarks/copy_sources.py --limit 100 --seed 8
    python benchmarks/copy_sources.py --limit 100 --seed 8 --lines rule
    python benchmarks/copy_sources.py --limit 200 --seed 8 --lines rule --sites-only --checkpoint RUN/checkpoints/step-N
"""

import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import joint_probe_inputs  # noqa: E402
from fact_copies import copies, prompt_lines  # noqa: E402
from rule_lookups import SENTENCE  # noqa: E402
from rule_lookups import rule_copies as rule_lookups  # noqa: E402

LINES = ("fact", "rule")
OPENING = "Anyone who is "  # what every rule sentence writes before its first condition


@dataclass(frozen=True)
class Site:
    """Token `k` of the answer: its target `right`, and `rival`, the token another pilot's line
    writes after the same tokens."""

    k: int
    right: int
    rival: int


@dataclass(frozen=True)
class Part:
    """One removable part: `name`, the module whose input (`where="input"`, columns [start, stop)
    of its last dimension) or output (`where="output"`, all of it) is set to zero."""

    name: str
    module: object
    where: str
    start: int = 0
    stop: int = 0


def rival_sites(copy: list[int], others: list[list[int]]) -> list[tuple[int, int]]:
    """`(j, rival)` for each token j ≥ 2 of a copy (token ids after the name: the verb, then a
    property) where another line's tokens equal the copy's tokens before j and differ at j. The
    first rival found at j is kept."""
    sites = {}
    for other in others:
        j = next((i for i, (a, b) in enumerate(zip(copy, other)) if a != b), None)  # where they part
        if j is not None and j >= 2:
            sites.setdefault(j, other[j])
    return sorted(sites.items())


def rule_copies(reasoning: str) -> list[tuple[str, int, int]]:
    """`(property, start, end)` of each rule copied in a derivation (`rule_lookups.rule_copies`, which
    spans from the first condition): the characters from `Anyone` through the full stop."""
    return [(rule, start - len(OPENING), end) for start, end, rule, _, _ in rule_lookups(reasoning)]


def prompt_rules(prompt: str) -> dict[str, str]:
    """{property: its prompt rule} (`"Anyone who is insured is approved."`)."""
    return {m[2]: m[0] for m in SENTENCE.finditer(prompt)}


def example_sites(tokenizer, forced, example, lines: str = "fact") -> list[Site]:
    """The rival sites of every fact-line copy (or rule copy, `lines="rule"`) in `example`'s
    derivation, as answer token indices. A copy whose tokens differ from its own prompt line's
    (tokenized alone) is left out."""
    spans, texts = (copies, prompt_lines) if lines == "fact" else (rule_copies, prompt_rules)
    lines = {key: tokenizer(text, add_special_tokens=False).input_ids for key, text in texts(example.prompt).items()}
    at = forced.answer.index(example.reasoning)
    sites = []
    for pilot, start, end in spans(example.reasoning):
        inside = forced.tokens(at + start, at + end)
        copy = forced.targets[inside].tolist()
        if lines.get(pilot) != copy:
            continue
        others = [tokens for other, tokens in lines.items() if other != pilot]
        sites += [Site(inside[j], copy[j], rival) for j, rival in rival_sites(copy, others)]
    return sites


def parts(model) -> list[Part]:
    """Every attention head, every GDN value head and every layer's MoE block of `model`."""
    found = []
    for i, layer in enumerate(model.model.layers):
        if layer.kind == "linear_attention":
            gdn = layer.linear_attn
            found += [Part(f"L{i} GDN head {h}", gdn.out_proj, "input", h * gdn.head_v_dim, (h + 1) * gdn.head_v_dim)
                      for h in range(gdn.num_v_heads)]
        else:
            attn = layer.self_attn
            found += [Part(f"L{i} attention head {h}", attn.o_proj, "input", h * attn.head_dim,
                           (h + 1) * attn.head_dim) for h in range(attn.num_heads)]
        found.append(Part(f"L{i} MoE", layer.mlp, "output"))
    return found


@contextmanager
def removed(part: Part):
    """`part` set to zero while the context is open."""
    import torch

    if part.where == "input":
        def hook(module, args):
            x = args[0].clone()
            x[..., part.start:part.stop] = 0
            return (x, *args[1:])
        handle = part.module.register_forward_pre_hook(hook)
    else:
        def hook(module, args, output):
            return (torch.zeros_like(output[0]), *output[1:])
        handle = part.module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def causal_margins(model, ids, start: int, sites: list[Site]) -> list[float]:
    """The right token's logit minus the rival's at each site, from one causal forward over `ids`
    [1, T]: the prompt, then the answer from column `start`."""
    logits = model(ids).logits[0, start - 1:]  # row k predicts answer token k
    return [float(logits[s.k, s.right] - logits[s.k, s.rival]) for s in sites]


def effects(base: list[float], ablated: list[float]) -> dict[str, float]:
    """Over the sites that are wrong (margin < 0) and right at `base`: the mean margin change and
    how many change side (wrong sites made right, right sites made wrong)."""
    wrong = [(b, a) for b, a in zip(base, ablated) if b < 0]
    right = [(b, a) for b, a in zip(base, ablated) if b >= 0]

    def mean(pairs):
        return sum(a - b for b, a in pairs) / max(len(pairs), 1)

    return {"wrong": mean(wrong), "mended": sum(a >= 0 for _, a in wrong),
            "right": mean(right), "broken": sum(a < 0 for _, a in right)}


def table(model, tokenizer, examples, lines: str = "fact", removals: bool = True) -> list[str]:
    """The sites of `examples`' fact-line (or rule, `lines`) copies and, with `removals`, per part
    removed, its effects on them (`effects`); each row is printed as it is measured."""
    import torch

    from clover.data import format_chat
    from clover.evaluation.field_loss import teacher_forced

    cases = []
    for example in examples:
        forced = teacher_forced(model, tokenizer, example)  # the answer's tokens and their spans
        if sites := example_sites(tokenizer, forced, example, lines):
            prompt = tokenizer(format_chat(tokenizer, example, enable_thinking=None).prompt,
                               add_special_tokens=False).input_ids
            ids = torch.cat((forced.targets.new_tensor(prompt), forced.targets))[None]
            cases.append((ids, len(prompt), sites))
    base = [m for case in cases for m in causal_margins(model, *case)]
    rows = [f"{len(base)} sites in {len(cases)} prompts, {sum(m < 0 for m in base)} wrong (rival above right)", "",
            f"{'part removed':<24}{'wrong: Δ margin':>17}{'mended':>8}{'right: Δ margin':>17}{'broken':>8}"]
    print("\n".join(rows if removals else rows[:1]), flush=True)
    for part in parts(model) if removals else ():
        with removed(part):
            ablated = [m for case in cases for m in causal_margins(model, *case)]
        e = effects(base, ablated)
        rows.append(f"{part.name:<24}{e['wrong']:>+17.2f}{e['mended']:>8}{e['right']:>+17.2f}{e['broken']:>8}")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    import torch

    def add_arguments(parser):
        parser.add_argument("--lines", choices=LINES, default="fact", help="the copies whose sites are measured")
        parser.add_argument("--sites-only", action="store_true", help="only count the sites and the wrong ones")

    model, tokenizer, examples, args = joint_probe_inputs(__doc__, limit=100, seed=8, what="each part removed in turn",
                                                          extra=add_arguments)
    with torch.inference_mode():
        table(model, tokenizer, examples, args.lines, removals=not args.sites_only)


if __name__ == "__main__":
    main()
