"""transformers' generate keywords on block diffusion (see clover/model/generation.py):
max_length, min_new_tokens, num_return_sequences, stop_strings, logits_processor, right padding,
and the refusals with their reasons."""

import pytest
import torch
from transformers import LogitsProcessor, StoppingCriteriaList

import clover
from clover.loading import LoadOptions, load_model_and_tokenizer
from decoding_helpers import CONTROLS_OFF, left_pad, one_thread, peaked_model, prompt, response  # noqa: F401

SETTINGS = dict(CONTROLS_OFF, eos_token_id=[5], pad_token_id=0, block_size=4, threshold=0.8)


@pytest.fixture(scope="module")
def model():
    return peaked_model(seed=2)


def test_max_length_is_the_total_length(model):
    ids = torch.tensor([prompt(6, seed=1)])
    by_total = model.generate(ids, max_length=6 + 10, **SETTINGS)
    by_new = model.generate(ids, max_new_tokens=10, **SETTINGS)
    assert torch.equal(by_total, by_new)
    with pytest.raises(ValueError, match="max_length=6 leaves no room"):
        model.generate(ids, max_length=6, **SETTINGS)


def test_min_new_tokens_keeps_eos_out_of_the_first_positions(model):
    ids = torch.tensor([prompt(6, seed=1)])
    first = response(model.generate(ids, max_new_tokens=12, **SETTINGS), 6)[0]
    settings = dict(SETTINGS, eos_token_id=[first])  # the first token greedy picks is now EOS
    short = model.generate(ids, max_new_tokens=12, return_dict_in_generate=True, **settings)
    assert short.rows[0].new_tokens == 1 and short.rows[0].stop_reason == "eos"
    held = model.generate(ids, max_new_tokens=12, min_new_tokens=7, return_dict_in_generate=True, **settings)
    assert first not in response(held, 6)[:7] and held.rows[0].new_tokens >= 7
    with pytest.raises(ValueError, match=r"min_new_tokens=13 is invalid: must be in \[0, max_new_tokens=12\]"):
        model.generate(ids, max_new_tokens=12, min_new_tokens=13, **settings)


def test_num_return_sequences_repeats_rows_and_samples_each(model):
    flat = peaked_model(seed=2, head_scale=1.0)  # flat distributions: samples differ
    ids, mask = left_pad([prompt(4, seed=1), prompt(7, seed=2)])
    out = flat.generate(ids, attention_mask=mask, num_return_sequences=3, do_sample=True, temperature=1.5,
                         seed=0, max_new_tokens=8, **SETTINGS)
    assert out.shape[0] == 6
    assert torch.equal(out[:3, :ids.shape[1]], ids[0].expand(3, -1))  # rows i*n .. i*n+n-1: prompt i
    assert len({tuple(r) for r in out[:3, ids.shape[1]:].tolist()}) > 1  # sampled independently
    with pytest.raises(ValueError, match="num_return_sequences=2 needs sampling"):
        model.generate(ids, attention_mask=mask, num_return_sequences=2, do_sample=False, **SETTINGS)


def test_right_padded_batch_decodes_as_the_left_padded_one(model):
    prompts = [prompt(4, seed=1), prompt(9, seed=2)]
    left_ids, left_mask = left_pad(prompts)
    right_ids = torch.tensor([p + [0] * (9 - len(p)) for p in prompts])
    right_mask = torch.tensor([[1] * len(p) + [0] * (9 - len(p)) for p in prompts])
    right = model.generate(right_ids, attention_mask=right_mask, max_new_tokens=10, **SETTINGS)
    left = model.generate(left_ids, attention_mask=left_mask, max_new_tokens=10, **SETTINGS)
    assert torch.equal(right, left)
    holes = torch.tensor([[1, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 9])
    with pytest.raises(ValueError, match="left-padded"):
        model.generate(right_ids, attention_mask=holes, **SETTINGS)


class Ban(LogitsProcessor):
    """Bans one token; records the input_ids it was shown."""

    def __init__(self, token: int):
        self.token, self.seen = token, []

    def __call__(self, input_ids, scores):
        self.seen.append(input_ids.clone())
        scores = scores.clone()
        scores[:, self.token] = float("-inf")
        return scores


def test_user_logits_processor_is_applied_with_the_context(model):
    p = prompt(6, seed=3)
    ids = torch.tensor([p])
    plain = response(model.generate(ids, max_new_tokens=12, **SETTINGS), 6)
    banned = Ban(plain[0])
    out = response(model.generate(ids, max_new_tokens=12, logits_processor=[banned], **SETTINGS), 6)
    assert plain[0] not in out and out != plain
    assert all(s[0, :6].tolist() == p for s in banned.seen)  # the prompt, then committed tokens
    longest = max(banned.seen, key=lambda s: s.shape[1])[0, 6:].tolist()
    assert longest and out[:len(longest)] == longest


@pytest.mark.parametrize("kwargs, reason", [
    (dict(use_cache=False), "use_cache=False is not supported: block diffusion decodes against its cache"),
    (dict(num_beams=2), "num_beams=2 is not supported: beam search"),
    (dict(output_scores=True), "output_scores=True is not supported: block diffusion fills a block"),
    (dict(output_hidden_states=True), "not recorded while decoding"),
    (dict(stopping_criteria=StoppingCriteriaList([lambda ids, scores, **k: False])),
     "StoppingCriteria are called after every single token"),
    (dict(stop_strings=["x"]), "stop_strings needs tokenizer="),
])
def test_refusals_say_why(model, kwargs, reason):
    with pytest.raises(ValueError) as e:
        model.generate(torch.tensor([prompt(4)]), max_new_tokens=4, **SETTINGS, **kwargs)
    assert reason in str(e.value)
    model.generate(torch.tensor([prompt(4)]), max_new_tokens=4, use_cache=True, num_beams=1,
                   output_scores=False, **SETTINGS)  # the neutral values pass


def test_stop_strings_end_the_response_after_the_string():
    model, tokenizer = load_model_and_tokenizer(clover.default_model_dir(), LoadOptions(device="cpu"))
    from clover.data import get_task

    messages = [{"role": "user", "content": get_task("record").generate(seed=1, split="eval").prompt}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         enable_thinking=False)
    ids = tokenizer(text, return_tensors="pt").input_ids
    width = ids.shape[1]
    full = model.generate(ids, max_new_tokens=64, do_sample=False, return_dict_in_generate=True)
    full_text = tokenizer.decode(full.sequences[0, width:], skip_special_tokens=True)
    assert len(full_text) > 12, full_text
    stop = full_text[6:10]  # a piece from the middle of the greedy answer
    out = model.generate(ids, max_new_tokens=64, do_sample=False, stop_strings=[stop], tokenizer=tokenizer,
                         return_dict_in_generate=True)
    row = out.rows[0]
    tokens = out.sequences[0, width:width + row.new_tokens].tolist()
    cut_text = tokenizer.decode(tokens, skip_special_tokens=True)
    assert row.stop_reason == "stop" and stop in cut_text
    assert stop not in tokenizer.decode(tokens[:-1], skip_special_tokens=True)  # ends at the completing token
    assert full_text.startswith(cut_text) and len(cut_text) < len(full_text)
    assert out.num_forward_passes < full.num_forward_passes  # decoding stopped early
