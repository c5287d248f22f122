"""`benchmarks/owner_probe.py` samples every token of each fact line's list, in the prompt and in the
derivation's copies, labelled with the line's pilot."""

import re

import torch

from clover.data import eval_examples, get_task
from benchmark_script import load_benchmark

owner_probe = load_benchmark("owner_probe")
# the prompt's fact lines and the derivation's copies of them, found independently of the probe
PROMPT_FACT = re.compile(r"^(\w+) ((?:is [^.]+|has none of these)\.)$", re.MULTILINE)
FACT_COPY = re.compile(r"\? (?:\w+: [^.]+\. )?((\w+) (?:is [^.]+|has none of these)\.)")


def test_samples_are_the_list_tokens_of_each_line_with_two_or_more_pilots(model, tokenizer):
    examples = eval_examples(12, seed=0, tasks=[get_task("joint", facts="stated")])  # the probe reads `is` lines
    with torch.inference_mode():
        samples = owner_probe.owner_samples(model, tokenizer, examples)
    several = [e for e in examples if len(PROMPT_FACT.findall(e.prompt)) >= 2]
    assert several and set(samples) == set(owner_probe.PLACES)
    lines = [(m[1], m[2]) for e in several for m in PROMPT_FACT.finditer(e.prompt)]
    assert len(samples["prompt, first word"][1]) == len(lines)  # one first word per line
    copies = [m for e in several for m in FACT_COPY.finditer(e.reasoning)]
    assert len(samples["copy, first word"][1]) == len(copies)
    words = sum(len(re.findall(r"\w+", text.removeprefix("is "))) for _, text in lines)
    assert len(samples["prompt, later"][1]) >= words - len(lines)  # every later word (and the spaces)
    for features, labels in samples.values():
        assert all(f.shape == (len(model.model.layers) + 1, model.config.hidden_size) for f in features)
    assert set(samples["prompt, first word"][1]) == {pilot for pilot, _ in lines}


def test_list_tokens_are_those_inside_the_span():
    offsets = [(0, 3), (3, 4), (4, 6), (6, 7), (7, 15), (15, 16)]  # `Mia is licensed.`
    assert owner_probe.list_tokens(offsets, 7, 15) == [4]
    assert owner_probe.list_tokens(offsets, 4, 15) == [2, 3, 4]
