"""Structured output: OpenAI's `response_format` as a grammar over the model's tokens (llguidance).

    grammar = response_format_grammar(tokenizer, vocab_size, {"type": "json_schema", "json_schema": {...}})
    model.generate(ids, grammar_constraints=[grammar.constraint()])   # one fresh constraint per row

`json_object` is any JSON object; `json_schema` is the given schema (always enforced, `strict` or
not). Output is compact JSON (separators "," and ":", no free whitespace), so a value always ends in
a bounded number of tokens beyond its content. Why llguidance (measured against xgrammar and
outlines-core on the embedded tokenizer): BENCHMARKS.md, "Structured output: grammar libraries".
The decoding rule (left-to-right runs inside a block): `clover/model/generation_sampling.py`.
"""

import json
import threading
import weakref
from dataclasses import dataclass

import torch

COMPACT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
_adapters: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # tokenizer -> {vocab size: LLTokenizer}
_adapters_lock = threading.Lock()


class GrammarError(ValueError):
    """A `response_format` that cannot be served; `param` names the request field at fault."""

    def __init__(self, message: str, param: str = "response_format"):
        super().__init__(message)
        self.param = param


def _llguidance():
    try:
        import llguidance
        import llguidance.hf
    except ImportError as e:  # a dependency of the package; absent only in a hand-made environment
        raise GrammarError("response_format needs the llguidance package (pip install llguidance==1.9.1)") from e
    return llguidance


def token_adapter(tokenizer, vocab_size: int):
    """llguidance's view of a Hugging Face fast tokenizer, built once per tokenizer and vocab size.
    `vocab_size` is the model's (logit columns beyond the tokenizer's tokens are never allowed)."""
    ll = _llguidance()
    with _adapters_lock:
        per_size = _adapters.setdefault(tokenizer, {})
        if vocab_size not in per_size:
            per_size[vocab_size] = ll.hf.from_tokenizer(tokenizer, n_vocab=max(vocab_size, len(tokenizer)))
        return per_size[vocab_size]


@dataclass(frozen=True)
class Grammar:
    """A compiled output grammar; `constraint()` gives each decoded row its own matcher."""

    adapter: object  # llguidance.LLTokenizer
    source: str  # llguidance's grammar text
    vocab_size: int

    def constraint(self) -> "GrammarConstraint":
        return GrammarConstraint(_llguidance().LLMatcher(self.adapter, self.source), self.vocab_size)


class GrammarConstraint:
    """One row's matcher, in the protocol of `clover.model.generation_sampling`."""

    def __init__(self, matcher, vocab_size: int):
        self.matcher, self.vocab_size = matcher, vocab_size
        self.bitmask = torch.zeros((vocab_size + 31) // 32, dtype=torch.int32)  # [W], 32 tokens a word
        self.bits = torch.arange(32, dtype=torch.int32)

    def allowed(self) -> torch.Tensor:
        """bool [V]: the tokens the grammar accepts next (llguidance's bitmask, unpacked)."""
        self.matcher.unsafe_compute_mask_ptr(self.bitmask.data_ptr(), self.bitmask.numel() * 4)
        self._check()
        return ((self.bitmask[:, None] >> self.bits) & 1).flatten()[:self.vocab_size].bool()  # [W, 32] -> [V]

    def accepts_end(self) -> bool:
        return self.matcher.is_accepting()

    def advance(self, token: int) -> None:
        self.matcher.consume_token(token)
        self._check()

    def _check(self) -> None:
        if self.matcher.is_error():
            raise RuntimeError(f"output grammar: {self.matcher.get_error()}")


def compile_json_schema(tokenizer, vocab_size: int, schema: dict, param: str) -> Grammar:
    """A grammar for JSON values matching `schema`; an unusable schema is a `GrammarError` that
    says what is wrong with it."""
    ll = _llguidance()
    adapter = token_adapter(tokenizer, vocab_size)
    try:
        source = ll.LLMatcher.grammar_from_json_schema(schema, defaults=COMPACT)
    except (ValueError, TypeError) as e:
        raise GrammarError(f"{param} is not a usable JSON schema: {e}", param) from None
    problem = ll.LLMatcher.validate_grammar(source, adapter)
    if problem:
        raise GrammarError(f"{param} is not a usable JSON schema: {' '.join(problem.split())}", param)
    return Grammar(adapter, source, vocab_size)


def response_format_grammar(tokenizer, vocab_size: int, response_format: dict | None) -> Grammar | None:
    """The grammar of an OpenAI `response_format` (None for absent or `{"type": "text"}`)."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return compile_json_schema(tokenizer, vocab_size, {"type": "object"}, "response_format")
    if kind != "json_schema":
        raise GrammarError(f"response_format type {kind!r} is not one of 'text', 'json_object', 'json_schema'",
                           "response_format.type")
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise GrammarError("response_format type 'json_schema' needs a 'json_schema' object "
                           "({'name': ..., 'schema': {...}})", "response_format.json_schema")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise GrammarError("response_format.json_schema.schema must be a JSON schema object, got "
                           f"{json.dumps(schema)[:80]}", "response_format.json_schema.schema")
    return compile_json_schema(tokenizer, vocab_size, schema, "response_format.json_schema.schema")
