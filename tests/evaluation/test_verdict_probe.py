"""`benchmarks/verdict_probe.py`: linear probes of the residual stream at joint's derived verdicts."""

import torch
from benchmark_script import load_benchmark

from clover import default_model_dir
from clover.data import eval_examples, get_task

verdict_probe = load_benchmark("verdict_probe")
lookup_probe = load_benchmark("lookup_probe")
common = load_benchmark("common")


def test_each_derived_verdict_gives_one_sample_per_probe_at_the_token_before_it():
    """One sample per derived line for the verdict probes, the first condition and the count, one per
    two-condition rule for the second; labels read off the line; the residuals are the stream at the
    position whose next token is the verdict."""
    _, model, tokenizer = common.embedded_fp32(str(default_model_dir()))
    examples = eval_examples(6, seed=20, tasks=[get_task("joint", line_rules="keyed")])
    with torch.inference_mode():
        samples = verdict_probe.verdict_samples(model.eval(), tokenizer, examples)
    lines = [line for e in examples for line in e.reasoning.splitlines() if ": " in line.split("? ", 1)[1]]
    verdicts = [line.rsplit(" ", 1)[1] for line in lines]
    assert len(lines) > 0 and samples["verdict"][1] == samples["verdict, where the length misleads"][1] == verdicts
    two = [line for line in lines if " and " in line.split(": ", 1)[1]]
    assert len(samples["second condition held"][1]) == len(two)
    assert [int(n) for n in samples["stated"][1]] == [
        len(verdict_probe.fact_words(verdict_probe.line_parts(line)[1])[1]) for line in lines]
    # the last layer's residual at a sample's position, through the final norm and the LM head, is
    # the model's own next-token prediction there: a verdict word (the embedded model writes the
    # sentence form, so its own lines are used here)
    sentence = [e for e in eval_examples(6, seed=20, tasks=[get_task("joint")]) if any(e.meta["derived"])]
    with torch.inference_mode():
        residual = verdict_probe.verdict_samples(model, tokenizer, sentence)["verdict"][0]
        words = [tokenizer.decode([model.lm_head(model.model.norm(r[-1])).argmax().item()]) for r in residual]
    assert set(words) <= {"yes", "no"} and len(words) == sum(sum(e.meta["derived"]) for e in sentence)


def test_misleading_lines_are_those_the_length_gets_wrong():
    assert verdict_probe.misleads(["yes", "yes", "no", "no", "yes"], ["1", "2", "2", "1", "3"]) == \
        [True, False, True, False, False]


def test_the_probe_scores_only_the_flagged_lines():
    """With `scored`, the held-out accuracy counts the flagged samples alone: a label the features
    give is read right on any subset, and a subset that is wrong by construction reads 0."""
    torch.manual_seed(0)
    features = torch.randn(400, 8)
    labels = ["a" if x > 0 else "b" for x in features[:, 0].tolist()]
    flags = [x > 0 for x in features[:, 0].tolist()]
    assert lookup_probe.probe_accuracy(features, labels, scored=flags) > 0.95
    flipped = [("b" if label == "a" else "a") if k >= 300 else label for k, label in enumerate(labels)]
    assert lookup_probe.probe_accuracy(features, flipped, scored=[True] * 400) < 0.1
