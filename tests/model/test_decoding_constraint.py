"""Grammar-constrained decoding (response_format): with a RANDOM-weight model the output still
always matches the schema, a block fills only in left-to-right runs, and unconstrained rows decode
exactly as before."""

import json

import jsonschema
import pytest
import torch

import clover
from clover.data.tokenizer import load_tokenizer
from clover.model.generation_batch import StepEvent
from clover.structured import response_format_grammar
from decoding_helpers import CONTROLS_OFF, one_thread  # noqa: F401 - autouse fixture
from tiny import tiny_model

TIME = {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"}
# The airspace answer's shape with every string and number of bounded length, so every output of
# any model ends (the grammar then allows only EOS) within the token budget.
ZONES = {
    "type": "array", "maxItems": 3,
    "items": {
        "type": "object",
        "properties": {"id": {"type": "string", "pattern": "^Z[0-9]{2}$"},
                       "location": {"enum": ["Old Town", "Sea Wall", "31.24N 121.47E"]},
                       "radius_km": {"type": "integer", "minimum": 1, "maximum": 8},
                       "start": TIME, "end": TIME, "active": {"type": "boolean"}},
        "required": ["id", "location", "radius_km", "start", "end"],
        "additionalProperties": False,
    },
}
EOS = (2, 0)  # the embedded tokenizer's <|im_end|>, <|endoftext|>


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(clover.default_model_dir())


@pytest.fixture(scope="module")
def random_model(tok):
    """Random weights over the embedded tokenizer's vocabulary; a scaled head makes many positions
    confident, so blocks fill several positions per step."""
    model = tiny_model(seed=3, vocab_size=len(tok), mask_token_id=tok.mask_token_id)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


@pytest.fixture(scope="module")
def zones(tok):
    return response_format_grammar(tok, len(tok), {"type": "json_schema",
                                                   "json_schema": {"name": "z", "schema": ZONES}})


def decode(model, tok, prompt: str, grammar, **kw):
    ids = torch.tensor([tok.encode(prompt)])
    settings = dict(max_new_tokens=160, block_size=8, threshold=0.6, eos_token_id=list(EOS), seed=0,
                    return_dict_in_generate=True, **CONTROLS_OFF)
    out = model.generate(ids, grammar_constraints=None if grammar is None else [grammar.constraint()],
                         **{**settings, **kw})
    return out, tok.decode(out.sequences[0, ids.shape[1]:], skip_special_tokens=True)


@pytest.mark.parametrize("mode,block_size,do_sample", [
    ("block_diffusion", 8, False), ("block_diffusion", 8, True), ("block_diffusion", 32, True), ("ar", 8, True)])
def test_random_model_output_always_matches_the_schema(random_model, tok, zones, mode, block_size, do_sample):
    for prompt in ("Read the notices.", "hello world", "NOTICE Z12"):
        out, text = decode(random_model, tok, prompt, zones, mode=mode, block_size=block_size,
                           do_sample=do_sample, temperature=1.5)
        assert out.rows[0].stop_reason == "eos", text
        jsonschema.validate(json.loads(text), ZONES)


def test_unconstrained_output_is_unchanged(random_model, tok, zones):
    """No grammar, an all-None list, and a batch beside a constrained row: the same tokens."""
    ids = torch.tensor([tok.encode("hello world")] * 2)
    settings = dict(max_new_tokens=48, block_size=8, threshold=0.6, eos_token_id=list(EOS), **CONTROLS_OFF)
    plain = random_model.generate(ids[:1], **settings)
    assert torch.equal(random_model.generate(ids[:1], grammar_constraints=[None], **settings), plain)
    mixed = random_model.generate(ids, grammar_constraints=[zones.constraint(), None], **settings)
    width = plain.shape[1]
    assert torch.equal(mixed[1, :width], plain[0]) and (mixed[1, width:] == tok.pad_token_id).all()
    assert not torch.equal(mixed[0, :width], plain[0])


def test_blocks_fill_left_to_right(random_model, tok, zones):
    """Every step fills a run that starts at the block's first masked position: after each step the
    filled positions of the block are a prefix of it, and each step fills at least one."""
    ids = torch.tensor([tok.encode("NOTICE Z12")])
    mask_id, runs = random_model.config.mask_token_id, []
    before = None
    for event in random_model.stream_generate(ids, max_new_tokens=160, block_size=8, threshold=0.6,
                                              eos_token_id=list(EOS), grammar_constraints=[zones.constraint()],
                                              **CONTROLS_OFF):
        if not isinstance(event, StepEvent):
            continue
        block, filled = event.block[0], event.filled[0]
        unfilled = (block == mask_id).int()
        first_masked = int(unfilled.argmax()) if unfilled.any() else len(block)
        assert (unfilled[first_masked:] == 1).all() and (unfilled[:first_masked] == 0).all(), block
        if before is not None and before[0] != event.block_index:
            before = None  # a new block
        start = 0 if before is None else before[1]
        assert filled.any() and filled.nonzero().flatten().tolist() == list(range(start, first_masked))
        runs.append(first_masked - start)
        before = (event.block_index, first_masked)
    assert len(runs) > 8 and max(runs) > 1  # several positions per forward still happen under the grammar


def test_self_spec_and_mismatched_rows_are_refused(random_model, tok, zones):
    ids = torch.tensor([tok.encode("hello")])
    with pytest.raises(ValueError, match="self_spec"):
        random_model.generate(ids, mode="self_spec", max_new_tokens=8, grammar_constraints=[zones.constraint()])
    with pytest.raises(ValueError, match="2 entries for 1 prompt rows"):
        random_model.generate(ids, max_new_tokens=8, grammar_constraints=[zones.constraint()] * 2)
