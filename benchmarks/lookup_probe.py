"""Where joint's rule lookup loses its information: linear probes on the residual stream, layer by layer.

A derived line copies the rule behind its asked property, `2. Is Kim cleared? Kim is rested. Anyone
who is licensed and rested is cleared. no`. In causal mode the rule's first condition is written from
the position just before it (after `Anyone who is `), and the prompt's rule holds it before the word
that finds the rule (`Anyone who is licensed and rested is cleared.`), so a lookup has to read it
where that word stands. A linear probe (softmax regression fitted on the first part of the
examples, scored on the rest; the residual stream after the embedding and after each decoder layer)
asks three things for each derived line:

- **key**: does the prompt rule's property word (`cleared`) hold the rule's first condition? This is
  what an attention layer after it can read there;
- **query**: does the line's position before the first condition hold the asked property (what the
  lookup must match)?
- **answer**: does that position hold the right first condition (what the next token needs)?

and then, for the query, where along the line the asked property is still held (from the question's
property word to the position before the first condition); last, whether any attention head at that
position looks up the key: its weight on the asked rule's property word against the other rules'.

Causal forwards over prompt and teacher-forced answer (what AR decoding sees), thinking on.

    python benchmarks/lookup_probe.py --limit 400 --seed 20
    python benchmarks/lookup_probe.py --checkpoint runs/decay-a/checkpoints/step-0004000 --limit 400 --seed 20
    python benchmarks/lookup_probe.py --model runs/keyed-lines/final --line-rules keyed --limit 400 --seed 20
"""

import sys
from pathlib import Path

import torch

from clover.data.tasks.joint import LINE_RULE_FORMS
from clover.model.attention import attention_scores
from clover.quantization.error import layer_outputs
from clover.training.copy_attention import RecordedAttention

sys.path.insert(0, str(Path(__file__).parent))
from common import embedded_probe_parser, load_probe_model  # noqa: E402
from rule_lookups import SENTENCE, rule_copies  # noqa: E402

QUESTIONS = ("key", "query", "answer")
# where along a derived line the asked property is probed for: the question's property word, its
# question mark, the fact line's first token and its full stop, the rule copy's first token, and the
# position that writes the rule's first condition (the query above)
ALONG = ("property word", "?", "fact line", "fact line's .", "rule", "before the condition")


def token_at(offsets: list[tuple[int, int]], char: int) -> int:
    """The index of the token whose span holds character `char`."""
    return next(k for k, (a, b) in enumerate(offsets) if a <= char < b)


def residuals(model, ids: list[int]) -> torch.Tensor:
    """[L + 1, T, D]: the residual stream after the embedding and after each decoder layer."""
    input_ids = torch.tensor([ids])
    outputs, _ = layer_outputs(model, input_ids)
    return torch.stack([model.model.embed_tokens(input_ids).float(), *outputs])[:, 0]


def line_positions(text: str, a: int) -> list[int]:
    """Character offsets in `text` of the `ALONG` places of the derived line whose rule copy's first
    condition starts at `a` (the last place, the condition itself, is stepped back a token later)."""
    line = text.rfind("\n", 0, a) + 1
    mark = text.index("?", line)
    fact_end = text.index(".", mark + 2)
    return [mark - 1, mark, mark + 2, fact_end, fact_end + 2, a]


def key_weights(recorded: list[list], position: int, right: int, others: list[int]) -> torch.Tensor:
    """[A, H, 2]: each full-attention layer's heads' weight from `position` on the column `right` and on
    the columns `others` together, from one causal forward's recorded calls."""
    weights = []
    for calls in recorded:
        query, keys, mask, _ = calls[0]  # one causal forward: one call per layer
        scores = attention_scores(query[:, :, position:position + 1], keys, mask[:, :, position:position + 1],
                                  query.shape[-1] ** -0.5)
        w = scores.softmax(-1)[0, :, 0]  # [H, S]
        weights.append(torch.stack([w[:, right], w[:, others].sum(-1)], dim=-1))
    return torch.stack(weights)


def probe_samples(model, tokenizer, examples) -> tuple[dict[str, tuple[list[torch.Tensor], list[str]]], torch.Tensor]:
    """({question: (residuals [L + 1, D] per derived line, label)} for each of `QUESTIONS` and each
    place of `ALONG`, and the attention on the keys [N, A, H, 2] (`key_weights`)) over the derived
    lines of `examples` (see the docstring)."""
    from clover.data.corpus import format_chat

    samples = {q: ([], []) for q in (*QUESTIONS, *ALONG)}
    attention = []
    for example in examples:
        chat = format_chat(tokenizer, example, enable_thinking=True)
        text = chat.prompt + chat.answer
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = [tuple(span) for span in encoded["offset_mapping"]]
        with RecordedAttention(model) as recorded:
            stream = residuals(model, encoded.input_ids)
        rules_block = chat.prompt.split("Facts")[0]
        # each rule's property word: its token column, and the rule's first condition
        conclusion = {m[2]: (token_at(offsets, m.start(2)), m[1].split()[0]) for m in SENTENCE.finditer(rules_block)}
        start = len(chat.prompt) + chat.answer.index(example.reasoning)
        for a, _, prop, _, place in rule_copies(example.reasoning):
            if not place.endswith("behind"):
                continue
            column, first = conclusion[prop]
            along = [token_at(offsets, start + c) for c in line_positions(example.reasoning, a)]
            before = along[-1] = along[-1] - 1  # the position that writes the first condition
            for question, position, label in (("key", column, first), ("query", before, prop),
                                              ("answer", before, first), *zip(ALONG, along, [prop] * len(ALONG))):
                samples[question][0].append(stream[:, position])
                samples[question][1].append(label)
            others = [c for p, (c, _) in conclusion.items() if p != prop]
            attention.append(key_weights(recorded, before, column, others))
    return samples, torch.stack(attention)


def probe_accuracy(features: torch.Tensor, labels: list[str], train_share: float = 0.75,
                   steps: int = 300, scored: list[bool] | None = None) -> float:
    """Held-out accuracy of a softmax regression from `features` [N, D] to `labels`, fitted on the
    first `train_share` of the samples (standardized by the fitted part's statistics); with `scored`
    (a flag per sample), only the held-out samples flagged count."""
    classes = sorted(set(labels))
    y = torch.tensor([classes.index(label) for label in labels])
    n = int(len(labels) * train_share)
    mean, std = features[:n].mean(0), features[:n].std(0) + 1e-6
    x = (features - mean) / std
    probe = torch.nn.Linear(x.shape[1], len(classes))
    optimizer = torch.optim.Adam(probe.parameters(), lr=1e-2, weight_decay=1e-3)
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(probe(x[:n]), y[:n]).backward()
        optimizer.step()
    keep = torch.ones(len(labels), dtype=torch.bool) if scored is None else torch.tensor(scored)
    with torch.no_grad():
        return (probe(x[n:]).argmax(-1) == y[n:])[keep[n:]].float().mean().item()


def most_common_share(labels: list[str], train_share: float = 0.75, scored: list[bool] | None = None) -> float:
    """The share of the most common label among the held-out samples that `probe_accuracy` scores."""
    n = int(len(labels) * train_share)
    rest = [label for k, label in enumerate(labels[n:], n) if scored is None or scored[k]]
    return max(rest.count(label) for label in set(rest)) / len(rest)


def layer_table_head(model, columns: list[str]) -> list[str]:
    """The two header rows of a markdown table of probes by layer: `columns`, then the embedding and
    each decoder layer, right-aligned."""
    layers = ["embedding", *(f"layer {k}" for k in range(len(model.model.layers)))]
    return ["| " + " | ".join([*columns, *layers]) + " |",
            "|---|" + "---:|" * (len(columns) - 1 + len(layers))]


def layer_cells(features: list[torch.Tensor], labels: list[str], scored: list[bool] | None = None) -> list[str]:
    """A probe's held-out accuracy (`probe_accuracy`) after the embedding and each decoder layer, as
    table cells, from residuals [L + 1, D] per sample."""
    stacked = torch.stack(features)  # [N, L + 1, D]
    return [f"{probe_accuracy(stacked[:, k].float(), labels, scored=scored):.2f}" for k in range(stacked.shape[1])]


def joint_probe_inputs(doc: str):
    """(args, path, model in eval mode, tokenizer, joint examples) for a probe of joint's derivation
    lines: the embedded probe's options plus --line-rules, 400 prompts of seed 20 by default."""
    from clover.data import eval_examples, get_task

    parser = embedded_probe_parser(doc, limit=400, limit_help="joint prompts", seed=20)
    parser.add_argument("--line-rules", choices=LINE_RULE_FORMS, default="sentence",
                        help="the form of the rules joint's lines write (the prompt keeps its sentences)")
    args = parser.parse_args()
    path, model, tokenizer = load_probe_model(args)
    torch.manual_seed(0)
    examples = eval_examples(args.limit, seed=args.seed, tasks=[get_task("joint", line_rules=args.line_rules)])
    return args, path, model.eval(), tokenizer, examples


def main() -> None:
    args, path, model, tokenizer, examples = joint_probe_inputs(__doc__)
    with torch.inference_mode():
        samples, attention = probe_samples(model, tokenizer, examples)
    n = len(samples["key"][1])
    print(f"model {path}, {args.limit} joint prompts of seed {args.seed}: {n} derived lines, "
          f"probes fitted on the first 3/4, held-out accuracy\n")
    layers = ["embedding", *(f"layer {k}" for k in range(len(model.model.layers)))]
    print("| probe | most common label | " + " | ".join(layers) + " |")
    print("|---|" + "---:|" * (len(layers) + 1))
    for rows in (QUESTIONS, ALONG):
        for question in rows:
            stacked, labels = torch.stack(samples[question][0]), samples[question][1]  # [N, L + 1, D]
            common = most_common_share(labels)
            cells = [f"{probe_accuracy(stacked[:, k].float(), labels):.2f}" for k in range(stacked.shape[1])]
            print(f"| {'asked property at ' * (rows is ALONG)}{question} | {common:.2f} | " + " | ".join(cells) + " |")
    print("\n| full-attention layer | head most on the asked key | weight on the asked key | on the others | "
          "lines where the asked key has more |")
    print("|---|---:|---:|---:|---:|")
    for layer, weights in enumerate(attention.transpose(0, 1)):  # [N, H, 2]
        head = (weights[..., 0] - weights[..., 1]).mean(0).argmax().item()
        right, other = weights[:, head, 0], weights[:, head, 1]
        print(f"| {layer} | {head} | {right.mean():.3f} | {other.mean():.3f} | {(right > other).float().mean():.2f} |")


if __name__ == "__main__":
    main()
