"""What `response_format` does to block diffusion on the embedded model (CPU, one thread).

Airspace eval prompts (chat, thinking off), greedy, block 32, threshold 0.95, decoded free, with
the airspace answer's JSON schema (`grammar_libraries.AIRSPACE_SCHEMA`), and as `json_object`; AR
free decoding for reference. Reports tokens per decoding forward, tokens/s, the share of outputs
that parse as JSON, and task accuracy (exact answer).

    OMP_NUM_THREADS=1 nice -n 19 python benchmarks/structured_output.py [--n 24] [--write]

`--write` replaces the "Structured output: tokens per forward" section of BENCHMARKS.md.
"""

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import write_section  # noqa: E402
from grammar_libraries import AIRSPACE_SCHEMA  # noqa: E402

import clover  # noqa: E402
from clover.data import eval_examples, get_task  # noqa: E402
from clover.data.corpus import format_chat  # noqa: E402
from clover.data.tokenizer import load_tokenizer  # noqa: E402
from clover.loading import load_model  # noqa: E402
from clover.structured import response_format_grammar  # noqa: E402

FORMATS = {
    "free": None,
    "json_schema": {"type": "json_schema", "json_schema": {"name": "zones", "schema": AIRSPACE_SCHEMA}},
    "json_object": {"type": "json_object"},
}


def run(model, tok, examples, grammar, mode: str, max_new_tokens: int) -> dict:
    task = get_task("airspace")
    tokens = forwards = seconds = valid = correct = 0
    for example in examples:
        prompt, _ = format_chat(tok, example, enable_thinking=False)
        ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
        constraints = None if grammar is None else [grammar.constraint()]
        start = time.perf_counter()
        out = model.generate(ids, mode=mode, do_sample=False, max_new_tokens=max_new_tokens, block_size=32,
                             threshold=0.95, return_dict_in_generate=True, grammar_constraints=constraints)
        seconds += time.perf_counter() - start
        n = out.rows[0].new_tokens
        tokens += n
        forwards += out.num_forward_passes - out.num_prefill_forwards
        score = task.score(example, tok.decode(out.sequences[0, ids.shape[1]:ids.shape[1] + n]))
        valid += score["valid_json"]
        correct += score["correct"]
    k = len(examples)
    return dict(tokens_per_forward=tokens / forwards, tokens_per_s=tokens / seconds, valid=valid / k,
                accuracy=correct / k, tokens=tokens / k)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=24, help="airspace eval prompts")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    path = clover.default_model_dir()
    model, tok = load_model(path), load_tokenizer(path)
    examples = eval_examples(args.n, tasks=[get_task("airspace")])
    rows = []
    with torch.inference_mode():
        for name, fmt in FORMATS.items():
            grammar = response_format_grammar(tok, model.config.vocab_size, fmt)
            rows.append((f"block diffusion, {name}", run(model, tok, examples, grammar, "block_diffusion",
                                                         args.max_new_tokens)))
        rows.append(("AR, free", run(model, tok, examples, None, "ar", args.max_new_tokens)))
    lines = [
        f"Embedded model, {args.n} airspace eval prompts (chat, thinking off), greedy, block 32, threshold "
        f"0.95, max {args.max_new_tokens} new tokens, one CPU thread; tokens per decoding forward (prefill "
        "excluded). Command: `OMP_NUM_THREADS=1 nice -n 19 python benchmarks/structured_output.py --write`.",
        "",
        "| decoding | tokens/forward | tokens/s | valid JSON | exact answers | tokens/answer |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in rows:
        lines.append(f"| {name} | {r['tokens_per_forward']:.2f} | {r['tokens_per_s']:.0f} | {r['valid']:.0%} | "
                     f"{r['accuracy']:.0%} | {r['tokens']:.0f} |")
    print("\n".join(lines))
    if args.write:
        write_section(ROOT / "BENCHMARKS.md", "Structured output: tokens per forward", lines)


if __name__ == "__main__":
    main()
