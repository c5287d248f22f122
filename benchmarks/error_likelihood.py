"""Could a search over AR decodings (beam search, lookahead) mend the wrong answers? Their likelihood says.

For each prompt whose greedy AR answer is scored wrong, in the causal mode:
  - at the first token where greedy leaves the target: p(greedy token), p(target token) and the
    target's rank there (how close the decision was);
  - the log-probability of the whole greedy answer (to its end token) against the whole target's.

A search that keeps more candidates can only return an answer the model finds more likely than
greedy's; where the target is less likely than greedy's wrong answer, no search over this model's
probabilities finds it.

    python benchmarks/error_likelihood.py --model checkpoints/spaced-trailing-more --seed 0 --limit 40
"""

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import embedded_probe_parser, load_probe_model  # noqa: E402

TASKS = ("airspace", "joint")


def next_token_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log p(· | prompt, response[:i]) for each response position i [len(response), vocab], causal mode."""
    ids = torch.tensor([prompt + response], device=model.device)
    return model(ids).logits[0, len(prompt) - 1:-1].float().log_softmax(-1)


def picked(logprobs: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """Each position's log-probability of its token: [len(tokens), vocab] -> [len(tokens)]."""
    return logprobs.gather(1, torch.tensor(tokens, device=logprobs.device)[:, None])[:, 0]


def sequence_logprob(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log p(response | prompt) per response token [len(response)], causal mode."""
    return picked(next_token_logprobs(model, prompt, response), response)


def first_divergence(target_logprobs: torch.Tensor, greedy: list[int], target: list[int]) -> dict:
    """Where `greedy` first leaves `target`, read off the target's `next_token_logprobs`: the two
    tokens' probabilities and the target's rank."""
    k = next(i for i, (g, t) in enumerate(zip(greedy, target)) if g != t)
    probs = target_logprobs[k].exp()
    return {"at": k, "p_greedy": float(probs[greedy[k]]), "p_target": float(probs[target[k]]),
            "rank": int((probs > probs[target[k]]).sum()) + 1}


def wrong_answers(model, tokenizer, examples) -> list[dict]:
    """One row per example whose greedy AR answer its task scores wrong."""
    from clover.data import get_task
    from clover.training.sources import encode_examples

    tasks, rows = {}, []
    for example, pair in zip(examples, encode_examples(tokenizer, examples, True)):
        prompt, target = list(pair.prompt_ids), list(pair.response_ids)
        out = model.generate(torch.tensor([prompt], device=model.device), mode="ar", do_sample=False,
                             max_new_tokens=len(target) + 64)
        greedy = out[0, len(prompt):].tolist()
        end = greedy.index(target[-1]) + 1 if target[-1] in greedy else len(greedy)
        greedy = greedy[:end]
        text = tokenizer.decode(greedy, skip_special_tokens=False)
        task = tasks.setdefault(example.task, get_task(example.task))
        if task.score(example, text)["correct"] or greedy == target:
            continue
        logp = next_token_logprobs(model, prompt, target)
        row = {"task": example.task, "log_p_greedy": float(sequence_logprob(model, prompt, greedy).sum()),
               "log_p_target": float(picked(logp, target).sum())}
        row |= first_divergence(logp, greedy, target)  # both end in the end token: they part before
        row["context"] = tokenizer.decode(target[max(0, row["at"] - 10):row["at"]])
        row["tokens"] = (tokenizer.decode([greedy[row["at"]]]), tokenizer.decode([target[row["at"]]]))
        rows.append(row)
    return rows


def summary(rows: list[dict], n: int) -> list[str]:
    if not rows:
        return [f"0 of {n} greedy AR answers wrong"]
    likelier = sum(r["log_p_target"] > r["log_p_greedy"] for r in rows)
    return [f"{len(rows)} of {n} greedy AR answers wrong; at their first wrong token the target ranks "
            f"second in {sum(r['rank'] == 2 for r in rows)}, median p(greedy) "
            f"{statistics.median(r['p_greedy'] for r in rows):.2f}, median p(target) "
            f"{statistics.median(r['p_target'] for r in rows):.2f}",
            f"the target answer is likelier than greedy's wrong one in {likelier} of {len(rows)}: "
            f"{'a wider search could find those' if likelier else 'no search over these probabilities finds it'}"]


def main() -> None:
    from clover.data import eval_examples, get_task

    parser = embedded_probe_parser(__doc__, limit_help="prompts per task")
    args = parser.parse_args()
    path, model, tokenizer = load_probe_model(args)
    examples = eval_examples(args.limit, seed=args.seed, tasks=[get_task(name) for name in TASKS])
    print(f"model {path}, {len(examples)} prompts ({', '.join(TASKS)}; seed {args.seed}), thinking on, greedy AR\n")
    with torch.inference_mode():
        rows = wrong_answers(model, tokenizer, examples)
    for r in rows:
        print(f"{r['task']:9s} p {r['p_greedy']:.2f} vs {r['p_target']:.2f} (rank {r['rank']})  "
              f"log p {r['log_p_greedy']:7.2f} vs {r['log_p_target']:7.2f}  ...{r['context']!r} -> "
              f"{r['tokens'][0]!r} for {r['tokens'][1]!r}")
    print("\n" + "\n".join(summary(rows, len(examples))))


if __name__ == "__main__":
    main()
