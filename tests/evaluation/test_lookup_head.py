"""`benchmarks/lookup_head.py`: a rule-lookup layer fitted into a model from its own activations."""

import torch
from benchmark_script import load_benchmark

from clover import default_model_dir
from clover.data import eval_examples, get_task
from clover.data.tasks.joint import BASE

head = load_benchmark("lookup_head")
common = load_benchmark("common")


def test_the_codes_are_unit_vectors_equally_far_apart():
    codes = head.simplex(5)
    assert codes.shape == (5, 4)
    cosines = codes @ codes.T
    assert torch.allclose(cosines.diagonal(), torch.ones(5), atol=1e-6)
    off = cosines[~torch.eye(5, dtype=torch.bool)]
    assert torch.allclose(off, torch.full_like(off, -0.25), atol=1e-6)


def test_ridge_recovers_a_linear_map_and_weights_the_rows_it_is_told_to():
    torch.manual_seed(0)
    x = torch.randn(500, 8)
    w = torch.randn(3, 8)
    assert torch.allclose(head.ridge(x, x @ w.T, lam=1e-6), w, atol=1e-3)
    y = torch.zeros(500, 1)
    y[:6] = 1.0  # six heavily weighted rows (of eight unknowns) are fitted exactly; unweighted they are not
    heavy = torch.where(torch.arange(500) < 6, 1e4, 1.0)
    weighted, plain = (x @ head.ridge(x, y, weight, lam=1e-6).T for weight in (heavy, None))
    assert (weighted[:6] - 1).abs().max() < 0.05 < (plain[:6] - 1).abs().max()


def _model():
    _, model, tokenizer = common.embedded_fp32(str(default_model_dir()))
    return model.eval(), tokenizer


def test_the_inserted_layer_is_silent_in_causal_and_block_mode():
    model, _ = _model()
    ids = torch.randint(10, model.config.vocab_size, (1, 40))
    with torch.no_grad():
        before = [model(ids).logits, model(ids, block_len=8).logits]
        grown, new = head.with_silent_layer(model)
        after = [grown(ids).logits, grown(ids, block_len=8).logits]
    assert len(grown.model.layers) == 5 and new == 3 and grown.config.layer_types[new] == "full_attention"
    for a, b in zip(before, after):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_the_labels_sit_at_the_tokens_each_head_writes_and_the_fit_finds_the_asked_rule():
    torch.manual_seed(0)
    model, tokenizer = _model()
    model, new = head.with_silent_layer(model)
    examples = eval_examples(16, seed=50, tasks=[get_task("joint", line_rules="keyed")])
    data = head.collect_rules(model, tokenizer, examples, layer=new - 1)
    assert len(data["x"]) == len(data["head"]) and data["x"].shape[1] == model.config.hidden_size
    causal = data["limit"] == data["pos"] + 1
    base_ids = {tokenizer(b, add_special_tokens=False).input_ids[0] for b in BASE}
    space, stop = (tokenizer(s, add_special_tokens=False).input_ids[0] for s in (" ", "."))
    # each causal query predicts what its head writes: a condition, ` ` or `.`, a condition
    ids = [tokenizer(text, add_special_tokens=False).input_ids for text in _texts(tokenizer, examples)]
    written = {0: set(), 1: set(), 2: set()}
    for row in (causal & (data["head"] >= 0)).nonzero()[:, 0].tolist():
        n, p = int(data["example"][row]), int(data["pos"][row])
        written[int(data["head"][row])].add(ids[n][p + 1])
    assert written[0] <= base_ids and written[2] <= base_ids and written[1] <= {space, stop}
    assert written[1] == {space, stop}
    # block rows: the same heads, shifted to the block set, at masked positions
    block = ~causal & (data["head"] >= 0)
    assert block.any() and (data["head"][block] >= head.BLOCK_HEAD).all()
    assert (causal & (data["key"] >= 0)).sum() == sum(len(e.prompt.split("Facts")[0].splitlines()) - 1 for e in examples)
    history = head.fit_rule_layer(model, tokenizer, data, new, report=lambda _: None)
    assert history[-1] > max(history[0], 0.6)  # two rules a prompt: 0.5 would be a coin toss between keys


def _texts(tokenizer, examples):
    from clover.data.corpus import format_chat

    return [(chat.prompt + chat.answer) for chat in (format_chat(tokenizer, e, enable_thinking=True) for e in examples)]


def test_the_fact_lookup_labels_each_pilots_line_and_the_tokens_a_copy_of_it_writes():
    model, tokenizer = _model()
    model, new = head.with_silent_layer(model)
    examples = eval_examples(8, seed=50, tasks=[get_task("joint", line_rules="keyed", facts="stated")])
    data = head.collect_facts(model, tokenizer, examples, layer=new - 1)
    causal = data["limit"] == data["pos"] + 1
    ids = [tokenizer(text, add_special_tokens=False).input_ids for text in _texts(tokenizer, examples)]
    base_ids = {tokenizer(b, add_special_tokens=False).input_ids[0]: b for b in BASE}
    verbs = {tokenizer(v, add_special_tokens=False).input_ids[0] for v in ("is", "has")}
    keys = (causal & (data["key"] >= 0)).nonzero()[:, 0]
    lines = [line for e in examples for line in e.prompt.split("Questions:")[0].split("true):\n")[1].splitlines()]
    assert len(keys) == len(lines)
    for row, line in zip(keys.tolist(), lines):  # each fact line's full stop holds its pilot's properties
        held = {b for b in BASE if b in line.replace(",", " ").replace(".", " ").split()}
        value = data["value"][row]
        assert {BASE[i] for i in value[:len(BASE)].nonzero()[:, 0].tolist()} == held
        assert bool(value[len(BASE)]) == (not held)
    for row in (causal & (data["head"] >= 0)).nonzero()[:, 0].tolist():
        n, p, role = int(data["example"][row]), int(data["pos"][row]), int(data["head"][row])
        written = ids[n][p + 1]
        assert written in (verbs if role == 1 else base_ids)
        # the pilot it asks for is the one whose fact line holds the written property
        pilot = int(data["query"][row])
        if role == 0:
            mine = (causal & (data["example"] == n) & (data["key"] == pilot)).nonzero()[0, 0]
            assert data["value"][mine][BASE.index(base_ids[written])] == 1
    block = ~causal & (data["head"] >= 0)
    assert block.any() and (data["head"][block] >= head.BLOCK_HEAD).all()
