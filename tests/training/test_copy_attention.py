"""Copy supervision (clover/training/copy_attention.py): which prompt token a response token copies,
and the attention weight on it, read off the training forwards."""

import pytest
import torch

from clover.training.copy_attention import (FactTokens, KeyTokens, RecordedAttention, copy_attention_loss,
                                           copy_sources, fact_copy_spans, fact_line_sources, joint_fact_tokens,
                                           joint_key_tokens, key_sources, source_log_weights)
from clover.training.data import Pair, collate
from clover.training.loss import JointLoss, causal_logits, stream_logits
from clover.training.noising import noise_generator, sample_block_noise
from clover.training.trainer import TrainConfig
from tiny import tiny_model

EOS, PAD = 1, 0


def _batch(pairs, block_size=4):
    return collate(pairs, block_size=block_size, eos_id=EOS, pad_id=PAD, eos_ids=(EOS,))


def test_a_copied_span_points_at_its_source_after_enough_context():
    # prompt: 10 20 30 40 | 50 20 30 41 ; the response copies "20 30 40" after "10"
    batch = _batch([Pair((10, 20, 30, 40, 50, 20, 30, 41), (10, 20, 30, 40, 60, EOS))])
    sources = copy_sources(batch, min_context=2)[0].tolist()
    # 10: no left context in common (the prompt's 10 starts it); 20 after "10": 1 token of context,
    # under min_context; 30 after "10 20": column 2; 40 after "20 30": its own column 3 (41 differs);
    # 60 is not in the prompt; EOS is not either
    assert sources[:6] == [-1, -1, 2, 3, -1, -1]
    assert copy_sources(batch, min_context=1)[0, 1].item() == 1


def test_a_source_shared_by_two_equal_contexts_is_left_out():
    # "7 8 9" twice in the prompt: the copy of 9 after "7 8" matches both alike
    batch = _batch([Pair((7, 8, 9, 5, 7, 8, 9), (7, 8, 9, EOS))])
    assert copy_sources(batch, min_context=2)[0, 2].item() == -1


def test_left_padding_is_never_a_source_and_untargeted_columns_have_none():
    short = Pair((3, 4, 5), (3, 4, 5, EOS))
    long = Pair((9, 9, 9, 9, 9, 3, 4, 5), (3, 4, 5, 6, 7, 8, 2, EOS))  # pads the short row's prompt by 5
    batch = _batch([short, long])
    sources = copy_sources(batch, min_context=1)
    assert sources[0, 2].item() == 7  # the short row's "5" after "3 4", at its own column (after 5 pads)
    assert (sources[0][~batch.target_mask[0]] == -1).all()
    assert (sources[sources >= 0] >= 0).all() and not ((sources >= 0) & ~batch.target_mask).any()
    pad_columns = (batch.prompt_mask == 0).nonzero()[:, 1]
    assert not torch.isin(sources[0], pad_columns).any()


def _copy_batch():
    pairs = [Pair((5, 6, 7, 8, 9, 10, 11), (6, 7, 8, 9, 10, 12, EOS)),
             Pair((20, 21, 22, 23), (21, 22, 23, 24, 21, 22, EOS))]
    return _batch(pairs)


def test_the_fused_training_forwards_record_the_weights_one_causal_forward_gives():
    model = tiny_model()
    batch = _copy_batch()
    sources = copy_sources(batch, min_context=1)
    assert (sources >= 0).sum() >= 6
    p = batch.prompt_ids.shape[1]
    noisy = batch.response_ids.clone()
    noisy[:, ::2] = model.config.mask_token_id
    with torch.no_grad():
        with RecordedAttention(model) as one:
            causal_logits(model, batch)
        with RecordedAttention(model) as fused:
            stream_logits(model, batch, noisy, block_size=4)
    assert len(one[0]) == 1 and len(fused[0]) == batch.response_ids.shape[1] // 4 + 1
    for a, b in zip(one, fused):
        wa, wb = source_log_weights(a, sources, p), source_log_weights(b, sources, p)
        sourced = (sources >= 0)[:, None, :].expand_as(wa)
        assert torch.allclose(wa[sourced], wb[sourced], atol=1e-5), (wa[sourced] - wb[sourced]).abs().max()
        assert (wa[sourced] <= 0).all()
    assert all(layer.recorded is None for layer in RecordedAttention(model).layers)


def test_the_loss_is_the_best_head_s_weight_on_the_source_from_the_query_before_the_token():
    model = tiny_model()
    batch = _copy_batch()
    sources = copy_sources(batch, min_context=1)
    ids = torch.cat((batch.prompt_ids, batch.response_ids), dim=1)
    mask = torch.cat((batch.prompt_mask, torch.ones_like(batch.response_ids)), dim=1)
    with torch.no_grad(), RecordedAttention(model) as recorded:
        model(ids, attention_mask=mask)
        loss = copy_attention_loss(recorded, sources, batch.prompt_ids.shape[1])
    # the twin: softmax over each query row's visible keys, written out
    p, best = batch.prompt_ids.shape[1], []
    for n, j in (sources >= 0).nonzero().tolist():
        weights = []
        for calls in recorded:
            query, keys, visible, _ = calls[0]
            keys = keys.repeat_interleave(query.shape[1] // keys.shape[1], dim=1)
            for h in range(query.shape[1]):
                row = (keys[n, h] @ query[n, h, p + j - 1]) / query.shape[-1] ** 0.5
                row = row.masked_fill(~visible[n, 0, p + j - 1], float("-inf"))
                weights.append(row.softmax(-1)[sources[n, j]])
        best.append(max(weights))
    assert torch.allclose(loss, -torch.stack(best).log().mean(), atol=1e-5)


def test_training_on_the_copy_loss_moves_the_weight_onto_the_sources():
    model = tiny_model(scale=0.1).train()
    batch = _copy_batch()
    noise = sample_block_noise(batch.target_mask, 4, 0.1, noise_generator(0, 0))
    objective = JointLoss(model, 4, alpha=1.0, copy_attention=1.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        result = objective(batch, noise)
        optimizer.zero_grad()
        result.total.backward()
        optimizer.step()
        losses.append(result.l_copy.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_copy_attention_off_leaves_the_objective_as_it_was():
    model = tiny_model()
    batch = _copy_batch()
    noise = sample_block_noise(batch.target_mask, 4, 0.1, noise_generator(0, 0))
    plain = JointLoss(model, 4, alpha=1.0)(batch, noise)
    supervised = JointLoss(model, 4, alpha=1.0, copy_attention=0.5)(batch, noise)
    assert plain.l_copy is None and supervised.l_copy.item() > 0
    assert torch.allclose(supervised.total, plain.total + 0.5 * supervised.l_copy)
    with pytest.raises(ValueError, match="copy_attention=-0.1 must be >= 0"):
        TrainConfig(steps=1, batch_size=1, block_size=4, copy_attention=-0.1)


def test_named_heads_confine_the_loss_to_them():
    model = tiny_model()
    batch = _copy_batch()
    sources = copy_sources(batch, min_context=1)
    p = batch.prompt_ids.shape[1]
    with torch.no_grad(), RecordedAttention(model) as recorded:
        causal_logits(model, batch)
        last = len(recorded) - 1  # the tiny config's last full-attention layer
        one = copy_attention_loss(recorded, sources, p, heads=[(last, 3)])
        every = copy_attention_loss(recorded, sources, p)
        named_all = copy_attention_loss(recorded, sources, p, heads=[(layer, h) for layer in range(last + 1)
                                                                      for h in range(4)])
        with pytest.raises(ValueError, match=rf"copy head \({last + 1}, 0\) is not one of the model's "
                                             rf"{last + 1} full-attention layers x 4 heads"):
            copy_attention_loss(recorded, sources, p, heads=[(last + 1, 0)])
    weights = source_log_weights(recorded[last], sources, p)[:, 3]
    assert torch.allclose(one, -weights[sources >= 0].mean())
    assert torch.allclose(named_all, every) and every <= one


KEYS = KeyTokens(keys=frozenset({90, 91}), colon=33, stops=frozenset({21, 22}))


def test_a_keyed_copy_points_at_the_prompt_sentence_that_ends_with_its_key():
    # prompt: "a b is 90 ." "c is 91 .\n" "Is 90 ?" ; response: "90 : c d ." then "91 : a ." then "90 ?"
    prompt = (40, 41, 50, 90, 21, 42, 50, 91, 22, 51, 90, 52)
    response = (90, 33, 42, 43, 21, 91, 33, 40, 21, 90, 52, EOS)
    batch = _batch([Pair(prompt, response)])
    sources = key_sources(batch, KEYS)[0].tolist()
    # 90's sentence ends at column 3 (the question's 90 is followed by "?"), 91's at column 7; each copy's
    # tokens after its colon, up to its full stop, point there; keys, colons and the rest point nowhere
    assert sources[:12] == [-1, -1, 3, 3, 3, -1, -1, 7, 7, -1, -1, -1]


def test_a_key_without_a_prompt_sentence_and_untargeted_tokens_have_no_source():
    short = Pair((40, 50, 90, 21), (90, 33, 40, 21, EOS))
    long = Pair((40, 50, 91, 21, 5, 6, 7), (90, 33, 41, 21, 91, 33, 40, 22, EOS))  # no sentence ends with 90
    batch = _batch([short, long])
    sources = key_sources(batch, KEYS)
    assert sources[0, 2:4].tolist() == [2 + 3, 2 + 3]  # the short row's prompt is left-padded by 3
    assert sources[1, :4].tolist() == [-1] * 4 and sources[1, 6:8].tolist() == [2, 2]
    assert not ((sources >= 0) & ~batch.target_mask).any()


def test_a_rule_sentence_copy_points_at_the_prompt_sentence_that_ends_with_its_last_word():
    sentences = KeyTokens(keys=frozenset({90, 91}), colon=33, stops=frozenset({21, 22}), opener=70)
    # prompt: "Anyone a is 90 ." "Anyone c is 91 .\n"; response: "x . Anyone c is 91 . no Anyone a is 92 . Anyone b"
    prompt = (70, 40, 50, 90, 21, 70, 42, 50, 91, 22)
    response = (44, 21, 70, 42, 50, 91, 21, 60, 70, 40, 50, 92, 21, 70, 41, EOS)
    batch = _batch([Pair(prompt, response)])
    sources = key_sources(batch, sentences)[0].tolist()
    # the first copy, after its opener to its full stop, points at 91's prompt column (8); 92 ends no prompt
    # sentence and the last copy has no full stop: neither points anywhere; the keyed rows find nothing here
    assert sources[:16] == [-1, -1, -1, 8, 8, 8, 8] + [-1] * 9
    assert (key_sources(batch, KEYS) < 0).all()


def test_first_keys_source_only_each_rule_copy_s_first_condition():
    firsts = KeyTokens(keys=frozenset({90, 91}), colon=33, stops=frozenset({21, 22}), opener=70,
                       conditions=frozenset({40, 41, 42, 90, 91}))
    # prompt: "Anyone a is 90 ." "Anyone c and a is 91 .\n"; response: "Anyone 50 c and a is 91 . Anyone 50 a is 92 ."
    prompt = (70, 40, 50, 90, 21, 70, 42, 60, 40, 50, 91, 22)
    response = (70, 50, 42, 60, 40, 50, 91, 21, 70, 50, 40, 50, 92, 21, EOS)
    sources = key_sources(_batch([Pair(prompt, response)]), firsts)[0, :len(response)].tolist()
    # only the first property word after the first copy's opener (c, at 2) points at 91's column (10);
    # the second copy's key 92 ends no prompt sentence
    assert sources == [-1, -1, 10] + [-1] * 12


def joint_key_sources(target: str):
    """(tokenizer, [(example, prompt ids, reasoning ids, key_sources' row over the reasoning)]) for 16
    of joint's eval examples, with the embedded tokenizer's key tokens for `target`."""
    from clover import default_model_dir
    from clover.data import eval_examples, get_task
    from clover.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(default_model_dir())
    keys, rows = joint_key_tokens(tokenizer, target), []
    for example in eval_examples(16, seed=0, tasks=[get_task("joint", facts="stated")]):  # lines with `is`
        prompt = tokenizer(example.prompt, add_special_tokens=False).input_ids
        response = tokenizer(example.reasoning, add_special_tokens=False).input_ids
        sources = key_sources(_batch([Pair(tuple(prompt), (*response, EOS))]), keys)[0, :len(response)].tolist()
        rows.append((example, prompt, response, sources))
    return tokenizer, rows


def test_joint_s_rule_copies_point_at_the_asked_rule_s_property_word():
    tokenizer, rows = joint_key_sources("sentence_keys")
    found = 0
    for example, prompt, response, sources in rows:
        runs = []  # (pointed text, the prompt word pointed at) of each run of tokens with one source
        for j, column in enumerate(sources):
            if column >= 0 and (j == 0 or sources[j - 1] != column):
                runs.append(("", tokenizer.decode([prompt[column]])))
            if column >= 0:
                runs[-1] = (runs[-1][0] + tokenizer.decode([response[j]]), runs[-1][1])
        rules = [line for line in example.reasoning.split("\n") if " Anyone " in line]
        found += len(rules)
        assert [text for text, _ in runs] == [" " + line.split(" Anyone ")[1].rsplit(" ", 1)[0] for line in rules]
        assert [word for _, word in runs] == [line.split("?")[0].rsplit(" ", 1)[-1] for line in rules]
    assert found


def test_joint_s_first_keys_point_from_each_rule_copy_s_first_condition_at_its_rule():
    tokenizer, rows = joint_key_sources("first_keys")
    found = 0
    for example, prompt, response, sources in rows:
        pointed = [(tokenizer.decode([response[j]]), tokenizer.decode([prompt[c]]))
                   for j, c in enumerate(sources) if c >= 0]
        lines = [line for line in example.reasoning.split("\n") if " Anyone " in line]
        found += len(lines)
        assert pointed == [(line.split(" Anyone who is ")[1].split(" ")[0], line.split("?")[0].rsplit(" ", 1)[-1])
                           for line in lines]
    assert found
    with pytest.raises(ValueError, match="key target 'lines' must be one of"):
        joint_key_tokens(tokenizer, "lines")


def test_joint_s_key_tokens_are_single_tokens_of_the_embedded_tokenizer():
    from clover.data.tasks.joint import DERIVED
    from clover.data.tokenizer import load_tokenizer
    from clover import default_model_dir

    tokenizer = load_tokenizer(default_model_dir())
    keys = joint_key_tokens(tokenizer)
    assert {tokenizer.decode([k]) for k in keys.keys} == set(DERIVED) and tokenizer.decode([keys.colon]) == ":"
    assert {tokenizer.decode([s]) for s in keys.stops} == {".", ".\n"}
    assert keys.opener is None and tokenizer.decode([joint_key_tokens(tokenizer, "sentence_keys").opener]) == "Anyone"


def test_key_targets_train_through_the_objective_and_need_their_tokens():
    model = tiny_model()
    batch = _batch([Pair((40, 50, 90, 21, 42, 50, 91, 21), (90, 33, 42, 43, 21, 91, 33, 40, 21, EOS))])
    noise = sample_block_noise(batch.target_mask, 4, 0.1, noise_generator(0, 0))
    keyed = JointLoss(model, 4, alpha=1.0, copy_attention=1.0, key_tokens=KEYS)(batch, noise)
    with torch.no_grad(), RecordedAttention(model) as recorded:
        causal_logits(model, batch)
        expected = copy_attention_loss(recorded, key_sources(batch, KEYS), batch.prompt_ids.shape[1])
    assert torch.allclose(keyed.l_copy, expected, atol=1e-5)
    with pytest.raises(ValueError, match="copy_targets='lines' must be one of"):
        TrainConfig(steps=1, batch_size=1, block_size=4, copy_targets="lines")


def test_a_trainer_with_key_targets_is_refused_without_the_key_tokens():
    from clover.training.trainer import Trainer
    from tests.training.conftest import digits_dataset, digits_model

    config = TrainConfig(steps=1, batch_size=4, block_size=4, copy_attention=0.1, copy_targets="keys")
    with pytest.raises(ValueError, match="copy_targets='keys' needs the keyed copies' token ids"):
        Trainer(digits_model(seed=1), config, digits_dataset(4), progress=False)
    sentences = TrainConfig(steps=1, batch_size=4, block_size=4, copy_attention=0.1, copy_targets="sentence_keys")
    with pytest.raises(ValueError, match="copy_targets='sentence_keys' needs the keyed copies' token ids"):
        Trainer(digits_model(seed=1), sentences, digits_dataset(4), progress=False)
    trainer = Trainer(digits_model(seed=1), config, digits_dataset(4), progress=False, key_tokens=KEYS)
    assert trainer.train_step().l_copy == 0.0  # digits hold no keyed copy: nothing to point at


def test_the_copy_value_loss_reads_what_the_heads_write_in_the_fused_and_the_causal_forward():
    from clover.training.copy_attention import copy_value_loss

    model = tiny_model()
    batch = _batch([Pair((10, 20, 30, 40, 50, 20, 30, 41), (10, 20, 30, 40, 60, 20, 30, 41, EOS))])
    sources, heads = copy_sources(batch), ((0, 0), (0, 2))  # as the objective finds them
    assert (sources >= 0).sum() >= 2
    noise = sample_block_noise(batch.target_mask, 4, 0.1, noise_generator(0, 0))
    fused = JointLoss(model, 4, alpha=1.0, copy_attention=1.0, copy_heads=heads, copy_value=1.0)(batch, noise)
    recording = RecordedAttention(model, outputs=True)
    with torch.no_grad(), recording as recorded:
        causal_logits(model, batch)
    o_projs = [layer.o_proj for layer in recording.layers]
    p = batch.prompt_ids.shape[1]
    causal = copy_value_loss(recorded, recording.outputs, o_projs, sources, batch.response_ids, p, heads,
                             model.get_input_embeddings().weight)
    assert torch.allclose(fused.l_value, causal, atol=1e-5)
    # the twin: each head's write is o_proj of its input with every other head's columns zeroed
    written = 0
    for layer, head in heads:
        x = recording.outputs[layer][0][:, p - 1:-1]  # the causal rows that predict the response
        dim = x.shape[-1] // model.config.num_attention_heads
        kept = torch.zeros_like(x)
        kept[..., head * dim:(head + 1) * dim] = x[..., head * dim:(head + 1) * dim]
        written = written + o_projs[layer](kept)
    sourced = sources >= 0
    words = torch.nn.functional.normalize(model.get_input_embeddings().weight, dim=-1)
    logits = 10.0 * torch.nn.functional.normalize(written[sourced], dim=-1) @ words.T
    assert torch.allclose(causal, torch.nn.functional.cross_entropy(logits, batch.response_ids[sourced]), atol=1e-5)
    fused.total.backward()
    assert recording.layers[0].v_proj.weight.grad.abs().sum() > 0


def test_copy_value_needs_named_copy_heads():
    with pytest.raises(ValueError, match=r"copy_value=0.5 must be >= 0, and > 0 only with copy_attention and"):
        TrainConfig(steps=1, batch_size=1, block_size=4, copy_attention=0.1, copy_value=0.5)
    with pytest.raises(ValueError, match=r"copy_value=-1.0 must be >= 0"):
        TrainConfig(steps=1, batch_size=1, block_size=4, copy_value=-1.0)


FACTS = FactTokens(question=30, spaces=frozenset({31}), names=frozenset({60, 61}), stops=frozenset({21}))


def test_a_fact_line_copy_points_into_its_pilot_s_line_after_the_name():
    # prompt: Ana is a b . Bo is a c .   (Ana 60, Bo 61, is 62, a 70, b 71, c 72, . 21)
    # response: Ana is a b ? Bo is a c . : the first copy is no fact-line copy (no question mark before it)
    prompt = (60, 62, 70, 71, 21, 61, 62, 70, 72, 21)
    batch = _batch([Pair(prompt, (60, 62, 70, 71, 30, 61, 62, 70, 72, 21, EOS))])
    assert list(fact_copy_spans(batch.response_ids[0].tolist(), FACTS)) == [(6, 9)]
    everywhere, facts = copy_sources(batch)[0].tolist(), fact_line_sources(batch, FACTS)[0].tolist()
    assert everywhere[2:4] == [2, 3]  # the first copy has sources, but is not a fact line's
    # `is` after `? Bo` matches one token of context (under min_context); `a c .` walk Bo's line,
    # not Ana's `a b`
    assert facts[:11] == [-1, -1, -1, -1, -1, -1, -1, 7, 8, 9, -1]


def test_a_space_may_follow_the_question_mark_and_a_non_name_opens_no_fact_copy():
    assert list(fact_copy_spans([30, 31, 60, 31, 62, 70, 21], FACTS)) == [(4, 6)]  # spaces skipped
    assert list(fact_copy_spans([30, 31, 62, 70, 21], FACTS)) == []  # no pilot's name
    assert list(fact_copy_spans([30, 60, 62, 70], FACTS)) == []  # no full stop yet


def test_joint_s_fact_copies_point_into_the_asked_pilot_s_prompt_line():
    from clover import default_model_dir
    from clover.data import eval_examples, get_task
    from clover.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(default_model_dir())
    facts, found = joint_fact_tokens(tokenizer), 0
    assert tokenizer.decode([facts.question]) == "?" and {tokenizer.decode([s]) for s in facts.spaces} == {" ", "\n"}
    for example in eval_examples(16, seed=0, tasks=[get_task("joint", facts="stated")]):  # lines with `is`
        prompt = tokenizer(example.prompt, add_special_tokens=False).input_ids
        response = tokenizer(example.reasoning, add_special_tokens=False).input_ids
        sources = fact_line_sources(_batch([Pair(tuple(prompt), (*response, EOS))]), facts)[0].tolist()
        ends_line = [tokenizer.decode([t]).endswith("\n") for t in prompt]
        for first, stop in fact_copy_spans(response, facts):
            pilot = next(response[k] for k in range(first - 1, -1, -1) if response[k] in facts.names)
            # the pilot's prompt line: the one that its name opens
            start = next(k for k in range(1, len(prompt)) if prompt[k] == pilot and ends_line[k - 1])
            end = ends_line.index(True, start)
            pointed = [sources[j] for j in range(first, stop + 1) if sources[j] >= 0]
            found += len(pointed)
            assert all(start < column <= end for column in pointed), (tokenizer.decode([pilot]), example.prompt)
    assert found


def test_fact_copy_trains_its_own_head_beside_the_copy_term():
    model = tiny_model()
    prompt = (60, 62, 70, 71, 21, 61, 62, 70, 72, 21)
    batch = _batch([Pair(prompt, (60, 62, 70, 71, 30, 61, 62, 70, 72, 21, EOS))])
    noise = sample_block_noise(batch.target_mask, 4, 0.1, noise_generator(0, 0))
    plain = JointLoss(model, 4, alpha=1.0)(batch, noise)
    both = JointLoss(model, 4, alpha=1.0, copy_attention=0.5, fact_copy=0.25, fact_heads=((0, 1),),
                     fact_tokens=FACTS, fact_value=0.5)(batch, noise)
    with torch.no_grad(), RecordedAttention(model) as recorded:
        causal_logits(model, batch)
        p = batch.prompt_ids.shape[1]
        copy = copy_attention_loss(recorded, copy_sources(batch), p)
        fact = copy_attention_loss(recorded, fact_line_sources(batch, FACTS), p, ((0, 1),))
    assert torch.allclose(both.l_copy, copy, atol=1e-5) and torch.allclose(both.l_fact, fact, atol=1e-5)
    assert both.l_fact_value is not None and both.l_value is None
    expected = plain.total + 0.5 * copy + 0.25 * fact + 0.5 * both.l_fact_value
    assert torch.allclose(both.total, expected, atol=1e-5)
    with pytest.raises(ValueError, match="fact_copy needs the fact-line copies' token ids"):
        JointLoss(model, 4, alpha=1.0, fact_copy=0.25, fact_heads=((0, 1),))


def test_fact_copy_needs_its_heads_and_its_value_needs_it():
    with pytest.raises(ValueError, match=r"fact_copy=0.1 must be >= 0, and > 0 only with fact_copy_heads"):
        TrainConfig(steps=1, batch_size=1, block_size=4, fact_copy=0.1)
    with pytest.raises(ValueError, match=r"fact_copy_value=0.3 must be >= 0, and > 0 only with fact_copy"):
        TrainConfig(steps=1, batch_size=1, block_size=4, fact_copy_value=0.3)


def test_first_words_source_only_each_fact_copy_s_first_property_word():
    # as above; the property words a, b, c (70-72): `Bo is a c .` keeps `a` alone
    words = FactTokens(FACTS.question, FACTS.spaces, FACTS.names, FACTS.stops, words=frozenset({70, 71, 72}))
    prompt = (60, 62, 70, 71, 21, 61, 62, 70, 72, 21)
    batch = _batch([Pair(prompt, (60, 62, 70, 71, 30, 61, 62, 70, 72, 21, EOS))])
    assert fact_line_sources(batch, words)[0, :11].tolist() == [-1] * 7 + [7] + [-1] * 3


def test_joint_s_first_words_point_at_the_pilot_s_first_property():
    from clover import default_model_dir
    from clover.data import eval_examples, get_task
    from clover.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(default_model_dir())
    facts, found = joint_fact_tokens(tokenizer, "first_words"), 0
    for example in eval_examples(16, seed=0, tasks=[get_task("joint", facts="stated")]):  # lines with `is`
        prompt = tokenizer(example.prompt, add_special_tokens=False).input_ids
        response = tokenizer(example.reasoning, add_special_tokens=False).input_ids
        sources = fact_line_sources(_batch([Pair(tuple(prompt), (*response, EOS))]), facts)[0].tolist()
        pointed = [(tokenizer.decode([response[j]]), tokenizer.decode(prompt[c - 4:c + 1])) for j, c in enumerate(sources)
                   if c >= 0]
        # each pointed word is a copy's first property, at that word in the pilot's prompt line
        lines = [line for line in example.reasoning.split("\n") if " is " in line.split("?")[1].split(".")[0]]
        expected = [(line.split("?")[1].split(" is ")[1].split(" ")[0].strip(",."),
                     line.split("?")[1].strip().split(" ")[0]) for line in lines]
        assert [(word, context.split("\n")[-1].split(" ")[0]) for word, context in pointed] == expected
        found += len(pointed)
    assert found
    with pytest.raises(ValueError, match="fact target 'words' must be one of"):
        joint_fact_tokens(tokenizer, "words")
