"""Can a small Clover model learn `joint`'s base check, and what in the text makes it hard?

The embedded model answers `joint`'s base questions by the length of the pilot's fact line instead of
checking whether the asked property is in it (`joint_errors.py --teacher-forced`). This probe trains
a fresh 4-layer Clover model (GDN, attention, GDN, attention; hidden 96) from scratch on that one
check, in a synthetic layout of one-token words, and reports held-out accuracy as it trains:

    rules    with --rules, two lines:   R p and q is D .        (as `joint`'s rules, over the same properties)
    prompt   one fact line per pilot:   N is p and q .          (1-3 pilots, 0-3 of 3 properties)
    questions with --questions:         Is N X ? ...            (2-4, the asked one among them, as `joint`'s list)
    question                            Is N X ?
    derivation with --derivation:       Is N X ? <check> yes ...  (every listed question answered in turn, as
                                        `joint`'s derivation does; the asked one last, then its check)
    check    plain:  N is p and q .     (the fact line copied, as `joint`'s derivation does)
             marked: [ p q ]            (the properties between brackets seen nowhere else)
    answer   yes or no, predicted at the last position (half of each, as `JointTask(balanced=True)`)

With `--spaces` a space token follows every word, as the task tokenizer writes text (it never
merges a space into a word). With `--loss response` the loss is the trainer's: next-token
cross-entropy over the whole response (the check and the answer), not the answer alone. "1-2
stated" is the accuracy on fact lines of one or two properties, where the line's length alone does
not decide the answer (chance: 0.5).

    python benchmarks/membership_probe.py --layout marked [--spaces] [--rules] [--questions [--derivation]]
        [--loss response] [--steps 600] [--batch 64] [--seed 0]

About 0.2-2 s a step on one core at batch 64, the longer with more options.
"""

import argparse
import random
import time

import torch
import torch.nn.functional as F

from clover.model import CloverMoeConfig, CloverMoeForCausalLM


PAD, IS, AND, DOT, ASK, QMARK, OPEN, CLOSE, YES, NO, SPACE, RULE = range(12)
PROPERTIES = tuple(range(16, 22))  # 6, as `joint` draws its 3 base properties from
DERIVED = (22, 23)
NAMES = tuple(range(24, 44))
VOCAB = 48


def joined(props: list[int]) -> list[int]:
    """`p and q` (nothing for no properties)."""
    return [t for p in props for t in (p, AND)][:-1]


def fact_line(name: int, held: list[int]) -> list[int]:
    """`N is p and q .` (`N is .` when the pilot holds nothing)."""
    return [name, IS, *joined(held), DOT]


def rule_line(conditions: list[int], derived: int) -> list[int]:
    """`R p and q is D .`"""
    return [RULE, *joined(conditions), IS, derived, DOT]


def check(layout: str, name: int, held: list[int]) -> list[int]:
    """What follows a question: the pilot's fact line copied (plain), or its properties marked."""
    return fact_line(name, held) if layout == "plain" else [OPEN, *held, CLOSE]


def question(rng: random.Random, facts: dict[int, list[int]], base: list[int]) -> tuple[int, int, bool]:
    """(pilot, property, whether the pilot's fact line states it): yes or no with equal odds where the
    line leaves a choice, as `JointTask(balanced=True)` draws."""
    name = rng.choice(list(facts))
    held = facts[name]
    yes = len(held) == 3 or (bool(held) and rng.random() < 0.5)
    return name, rng.choice(held if yes else [p for p in base if p not in held]), yes


def sample(rng: random.Random, layout: str, spaces: bool, rules: bool = False,
           questions: bool = False, derivation: bool = False) -> tuple[list[int], int, int, int]:
    """(tokens, YES or NO, properties the asked pilot's fact line states, where the response starts:
    the check after the question, or with `derivation` the first question's copy after the list)."""
    base = rng.sample(PROPERTIES, 3)
    rule_lines = [t for d in DERIVED for t in rule_line(rng.sample(base, rng.choice((1, 2, 2))), d)] if rules else []
    names = rng.sample(NAMES, rng.randint(1, 3))
    facts = {n: [p for p in base if rng.random() < 0.55] for n in names}
    name, asked, yes = question(rng, facts, base)
    tokens = rule_lines + [t for n in names for t in fact_line(n, facts[n])]
    if derivation:  # 1-3 other questions, then the asked one; the response answers each in turn
        earlier: list[tuple[int, int, bool]] = []
        wanted = min(rng.randint(1, 3), 3 * len(names) - 1)  # as many as there are other pairs
        while len(earlier) < wanted:
            drawn = question(rng, facts, base)
            if drawn[:2] not in [(n, p) for n, p, _ in earlier] + [(name, asked)]:
                earlier.append(drawn)
        tokens += [t for n, p, _ in [*earlier, (name, asked, yes)] for t in (ASK, n, p, QMARK)]
        start = len(tokens)
        tokens += [t for n, p, y in earlier for t in (ASK, n, p, QMARK, *check(layout, n, facts[n]), YES if y else NO)]
        tokens += [ASK, name, asked, QMARK, *check(layout, name, facts[name])]
    else:
        listed = []
        if questions:  # the prompt's question list: the asked one and 1-3 others, in a random order
            others = [(n, p) for n in names for p in base if (n, p) != (name, asked)]
            listed = rng.sample(others, min(len(others), rng.randint(1, 3))) + [(name, asked)]
            rng.shuffle(listed)
        tokens += [t for n, p in listed for t in (ASK, n, p, QMARK)] + [ASK, name, asked, QMARK]
        start = len(tokens)
        tokens += check(layout, name, facts[name])
    if spaces:
        tokens, start = [t for word in tokens for t in (word, SPACE)], 2 * start
    return tokens, YES if yes else NO, len(facts[name]), start


def batch(rng: random.Random, n: int, layout: str, spaces: bool, rules: bool = False, questions: bool = False,
          derivation: bool = False):
    """Left-padded token ids [n, T], attention mask [n, T], answers [n], stated counts [n], and
    the response [n, T]: True where a position predicts the next token of the check (with `derivation`,
    of every line before the last answer)."""
    samples = [sample(rng, layout, spaces, rules, questions, derivation) for _ in range(n)]
    width = max(len(tokens) for tokens, *_ in samples)
    ids = torch.full((n, width), PAD)
    mask = torch.zeros(n, width, dtype=torch.long)
    response = torch.zeros(n, width, dtype=torch.bool)
    for row, (tokens, _, _, start) in enumerate(samples):
        ids[row, width - len(tokens):] = torch.tensor(tokens)
        mask[row, width - len(tokens):] = 1
        response[row, width - len(tokens) + start - 1:-1] = True  # from the prompt's last token on
    answers = torch.tensor([a for _, a, *_ in samples])
    stated = torch.tensor([s for _, _, s, _ in samples])
    return ids, mask, answers, stated, response


def probe_loss(logits: torch.Tensor, ids: torch.Tensor, answers: torch.Tensor, response: torch.Tensor | None):
    """Cross-entropy of the answer at the last position, and with `response` also of every next
    token of the check, averaged over all of them (the trainer's loss on the response)."""
    if response is None:
        return F.cross_entropy(logits[:, -1], answers)
    targets = torch.cat((ids[:, 1:], answers[:, None]), dim=1)  # [n, T]: each position's next token
    keep = response.clone()
    keep[:, -1] = True  # the check's positions, then the last one: the answer
    return F.cross_entropy(logits[keep], targets[keep])


def small_model(seed: int) -> CloverMoeForCausalLM:
    torch.manual_seed(seed)
    config = CloverMoeConfig(
        vocab_size=VOCAB, hidden_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=24, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=24, linear_value_head_dim=24, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=96, mask_token_id=VOCAB - 1,
        layer_types=["linear_attention", "full_attention"] * 2, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True)
    return CloverMoeForCausalLM(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layout", choices=("plain", "marked"), default="plain")
    parser.add_argument("--spaces", action="store_true", help="a space token after every word")
    parser.add_argument("--rules", action="store_true", help="two rule lines over the same properties first")
    parser.add_argument("--questions", action="store_true", help="a list of 2-4 questions after the facts")
    parser.add_argument("--derivation", action="store_true",
                        help="with --questions: answer every listed question in turn, the asked one last")
    parser.add_argument("--loss", choices=("answer", "response"), default="answer",
                        help="the answer alone, or every token of the check and the answer")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=64, help="training prompts per step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.derivation and not args.questions:
        parser.error("--derivation answers the question list: it needs --questions")
    torch.set_num_threads(args.threads)
    model = small_model(args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.95))
    options = (args.layout, args.spaces, args.rules, args.questions, args.derivation)
    ids, mask, answers, stated, _ = batch(random.Random(12345), 1024, *options)
    undecided = (stated == 1) | (stated == 2)
    rng, start = random.Random(args.seed + 1), time.time()
    print(f"layout {args.layout}, spaces {'on' if args.spaces else 'off'}, rules {'on' if args.rules else 'off'}, "
          f"questions {'on' if args.questions else 'off'}, derivation {'on' if args.derivation else 'off'}, "
          f"loss {args.loss}, seed {args.seed}, lr {args.lr}, "
          f"batch {args.batch}, {args.threads} thread(s); held-out: 1024 prompts")
    for step in range(1, args.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = args.lr * min(1.0, step / 20)
        x, m, y, _, response = batch(rng, args.batch, *options)
        loss = probe_loss(model(x, attention_mask=m).logits, x, y, response if args.loss == "response" else None)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 50 == 0:
            with torch.no_grad():
                right = model(ids, attention_mask=mask).logits[:, -1, [YES, NO]].argmax(-1) == (answers == NO)
            print(f"step {step:>5}  loss {loss.item():.3f}  accuracy {right.float().mean():.3f}  "
                  f"1-2 stated {right[undecided].float().mean():.3f}  ({time.time() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
