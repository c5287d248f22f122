"""`benchmarks/lookup_probe.py`: linear probes of the residual stream at joint's rule lookup."""

import torch
from benchmark_script import load_benchmark

from clover import default_model_dir
from clover.data import eval_examples, get_task
from clover.data.tasks.joint import BASE, DERIVED

probe = load_benchmark("lookup_probe")
common = load_benchmark("common")


def test_the_probe_finds_a_linear_label_and_not_a_random_one():
    torch.manual_seed(0)
    features = torch.randn(400, 16)
    planted = [("a", "b", "c")[k] for k in features[:, :3].argmax(1).tolist()]  # linear in the features
    noise = [("a", "b", "c")[k] for k in torch.randint(0, 3, (400,)).tolist()]
    assert probe.probe_accuracy(features, planted) > 0.9
    assert probe.probe_accuracy(features, noise) < 0.5


def test_each_derived_line_gives_a_key_a_query_and_an_answer_at_the_right_tokens():
    _, model, tokenizer = common.embedded_fp32(str(default_model_dir()))
    examples = eval_examples(6, seed=20, tasks=[get_task("joint")])
    with torch.inference_mode():
        samples, attention = probe.probe_samples(model.eval(), tokenizer, examples)
    keys, queries, answers = (samples[q] for q in probe.QUESTIONS)
    lines = sum(sum(e.meta["derived"]) for e in examples)
    assert len(keys[1]) == len(queries[1]) == len(answers[1]) == lines > 0
    assert set(keys[1]) <= set(BASE) and set(queries[1]) <= set(DERIVED) and keys[1] == answers[1]
    assert all(s.shape == (len(model.model.layers) + 1, model.config.hidden_size) for s in keys[0])
    # the embedding layer's row is the token's own embedding: the property word at the key
    first = examples[[any(e.meta["derived"]) for e in examples].index(True)]
    line = next(l for l in first.reasoning.splitlines() if "Anyone" in l)
    prop = line.split("?")[0].split()[-1]
    embedded = model.model.embed_tokens.weight[tokenizer.convert_tokens_to_ids(prop)]
    assert any(torch.equal(s[0], embedded) for s in keys[0])
    words = samples["property word"]  # along the line: the first place is the property word itself
    assert words[1] == queries[1] and all(len(samples[place][1]) == lines for place in probe.ALONG)
    assert all(torch.equal(s[0], model.model.embed_tokens.weight[tokenizer.convert_tokens_to_ids(label)])
               for s, label in zip(*words))
    assert all(torch.equal(a, b) for a, b in zip(samples["before the condition"][0], queries[0]))
    # each line's weights on the asked key and the other keys: one row per line, layer and head
    heads = model.config.num_attention_heads
    assert attention.shape == (lines, model.config.layer_types.count("full_attention"), heads, 2)
    assert (attention >= 0).all() and (attention.sum(-1) <= 1 + 1e-5).all()


def test_the_places_along_a_line_are_its_question_fact_line_and_rule():
    text = "1. Is Kim rested? Kim is rested. yes\n2. Is Kim cleared? Kim is rested. Anyone who is licensed is cleared. no"
    a = text.index("licensed")
    places = [text[c] for c in probe.line_positions(text, a)]
    assert places == ["d", "?", "K", ".", "A", "l"] and text[probe.line_positions(text, a)[0] - 6:][:7] == "cleared"
