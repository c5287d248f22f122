"""Copy supervision: an attention head is shown where the token it should copy sits in the prompt.

Most of a task's reasoning copies the prompt: joint's fact lines and rules, airspace's notices.
Copying one span token after token is a pointer walk: the query that predicts the next token
attends to the prompt position holding it (an induction head). Many wrong answers of the embedded
model are walks that leave their span (`Ola is insured and registered.` for `... and certified.`,
a line cut short or run on), and in joint no head of it attends to the sources (BENCHMARKS.md,
"Copy supervision").

For each response token, its source is the prompt position holding the same token whose left
context matches the token's own longest, when exactly one does and the match is at least
`min_context` tokens: in `Kim is rested. Anyone who is licensed and rested is cleared.`, `rested`
after `licensed and ` is the rule's own `rested` (the fact line's follows `is `). Since the token
itself is matched, a rule's first condition has a source whenever no other rule starts with the
same word (about two first conditions in three, in joint); a token whose best match is shared or
too short, or that is not in the prompt, has none and no loss.

The full-attention layers record their queries and keys in the training forwards (no extra
forward): for each sourced token, the loss is -log of the attention weight on its source from
the causal query that predicts it (the column before it), at the head that gives it most, over
every head of every full-attention layer (or of the heads named, `train.copy_heads`); the mean over
sourced tokens. Any head may take the job and the others are left alone; named heads confine it to
heads that copy already (in the embedded model, head 5 of the first full-attention layer and head 2
of the second put 0.3-0.5 of their weight on the sources of copy, airspace and record, but not of
joint: `benchmarks/copy_weights.py`).

With `train.copy_targets: "keys"` the targets are a lookup's key in place of the copied tokens: a
keyed copy in the response (joint's `line_rules: keyed`, `cleared: licensed and rested.`) attends,
from each of its tokens after the colon to its full stop, to the prompt's sentence that ends with
its key (`Anyone who is licensed and rested is cleared.`), at the key word. There the embedded
model's residual stream already holds the rule's conditions, and the keyed line holds the key just
before them, yet no head of it looks from one to the other (`benchmarks/lookup_probe.py`). Measured
from the embedded model, the heads learn to look at the prompt rules' property words, but at the
asked one no more than at the others, and the copies get worse (BENCHMARKS.md, "Where joint's rule
lookup fails").

With `train.copy_targets: "sentence_keys"` the same is asked of rules copied in the prompt's sentence
form: each token of a response sentence that opens with `Anyone`, after it to its full stop, attends
to the prompt sentence that ends with the same property word (the copy's own last word before its
full stop), at that word. The query there has to hold the asked property, which the shipped model's
does not (asked-property supervision, `line_owner.py`, puts it there).

With `train.copy_targets: "first_keys"` only the first condition of each such copy is sourced (its
first property word after the opener): the one token whose rule the words already written do not
name. Sentence keys' loss, a mean over every token of a copy, falls to 0.02 while the first
condition's lookup stays a near guess (BENCHMARKS.md, "The rule copies' query").

Over several heads the loss takes the best head per token, so heads that each look at one rule's
place meet it without telling the rules apart; for a lookup, name one head (BENCHMARKS.md, "One
token, one head"). A head that looks at the right word may still write nothing of it: with
`train.copy_value` > 0 what the named heads write into the residual stream at the query (their gated
outputs through their columns of `o_proj`) is read against every token's embedding and asked for
the sourced token (`copy_value_loss`).

Joint's fact-line copies are lookups too: in `2. Is Mia cleared? Mia is licensed and trained.` the
words after the name come from Mia's prompt line, and a copy that follows the words it has just
written slips into another pilot's line (`Mia is licensed` + `.`, from `Fay is licensed.`:
`benchmarks/fact_copies.py`). `fact_line_sources` keeps `copy_sources`' sources of the tokens of
each such copy after the name and its space (the sentence after a question mark that a pilot's name
opens): the left context they match includes the name, so each points into the pilot's own line. With
`train.fact_copy` > 0 a second, separately named head (`train.fact_copy_heads`) is trained on them,
beside the rule head, with its own value loss (`train.fact_copy_value`). Named on the first
full-attention layer's head that looks at them most, it learns to look and the copies do not change
(BENCHMARKS.md, "The rule lookup ships").
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from clover.model.attention import GatedAttention, attention_scores

from .data import Batch

MAX_CONTEXT = 16  # tokens of left context compared
SCALE = 10.0  # cosine similarity -> logit, in the copy value loss (as line_owner.SCALE)


def copy_sources(batch: Batch, min_context: int = 2, max_context: int = MAX_CONTEXT) -> torch.Tensor:
    """[N, R] long: the prompt column each targeted response token copies, or -1 (see module doc)."""
    prompt, real = batch.prompt_ids, batch.prompt_mask.bool()
    response = batch.response_ids
    p, r = prompt.shape[1], response.shape[1]
    seq = torch.cat((prompt, response), dim=1)  # [N, P + R]
    seq_real = torch.cat((real, torch.ones_like(response, dtype=torch.bool)), dim=1)
    same = (response[:, :, None] == prompt[:, None, :]) & real[:, None, :]  # [N, R, P]
    matching, context = same.clone(), torch.zeros(same.shape, dtype=torch.long, device=same.device)
    columns = torch.arange(r, device=same.device) + p
    for back in range(1, max_context + 1):
        left = seq[:, columns - back]  # [N, R]: the response tokens' neighbours `back` to the left
        left_real = seq_real[:, columns - back]
        source = torch.arange(p, device=same.device) - back  # the prompt candidates' neighbours
        inside = source >= 0
        source = source.clamp(min=0)
        source_real = real[:, source] & inside  # [N, P]
        matching &= (left[:, :, None] == prompt[:, None, source]) & left_real[:, :, None] & source_real[:, None, :]
        context += matching
    best, column = context.masked_fill(~same, -1).max(dim=-1)  # [N, R]
    ties = ((context == best[..., None]) & same).sum(dim=-1)
    sourced = (best >= min_context) & (ties == 1) & batch.target_mask
    return torch.where(sourced, column, torch.full_like(column, -1))


KEY_TARGETS = ("keys", "sentence_keys", "first_keys")  # copy targets that point at a lookup's key (module doc)
COPY_TARGETS = ("tokens", *KEY_TARGETS)  # each copied token's source, or its key


@dataclass(frozen=True)
class KeyTokens:
    """Token ids of a keyed copy: its possible keys, the colon after a key, and the full stops; with
    `opener` (the word that opens a rule sentence), the copies sourced are the sentences instead, and
    with `conditions` (every property word) only each sentence's first condition."""

    keys: frozenset[int]
    colon: int
    stops: frozenset[int]
    opener: int | None = None
    conditions: frozenset[int] | None = None


def single_tokens(tokenizer, texts, purpose: str) -> dict[str, int]:
    """{text: its token id} for each of `texts`, which `tokenizer` must write as one token each;
    refused, naming those it does not and `purpose`, otherwise."""
    ids = {text: tokenizer(text, add_special_tokens=False).input_ids for text in texts}
    if missing := [text for text, i in ids.items() if len(i) != 1]:
        raise ValueError(f"{purpose} needs each of {missing} to be one token of the tokenizer")
    return {text: i[0] for text, i in ids.items()}


def one_token_ids(tokenizer, texts) -> frozenset[int]:
    """The ids of those of `texts` that `tokenizer` writes as one token (the others left out)."""
    ids = [tokenizer(text, add_special_tokens=False).input_ids for text in texts]
    return frozenset(i[0] for i in ids if len(i) == 1)


def full_stops(tokenizer) -> frozenset[int]:
    """The tokens that end a sentence: `.`, and `.` with a newline where the tokenizer glues them."""
    return one_token_ids(tokenizer, (".", ".\n"))


def first_index(ids: list[int], wanted, start: int, end: int | None = None) -> int | None:
    """The first index k in [start, end) (end: len(ids)) with ids[k] in `wanted`, or None."""
    return next((k for k in range(start, len(ids) if end is None else end) if ids[k] in wanted), None)


def joint_key_tokens(tokenizer, target: str = "keys") -> KeyTokens:
    """Joint's keys (its derived properties), the colon and the full stops as `tokenizer` writes
    them; for the sentence targets (`target`, one of KEY_TARGETS) the rule sentences' opening word,
    and for "first_keys" every property word; each must be one token."""
    from clover.data.tasks.joint import BASE, DERIVED

    if target not in KEY_TARGETS:
        raise ValueError(f"key target {target!r} must be one of {KEY_TARGETS}")
    sentences, first = target != "keys", target == "first_keys"
    words = (*DERIVED, ":", ".", *(("Anyone",) if sentences else ()), *(BASE if first else ()))
    required = single_tokens(tokenizer, words, f"copy_targets='{target}'")
    return KeyTokens(frozenset(required[word] for word in DERIVED), required[":"], full_stops(tokenizer),
                     required["Anyone"] if sentences else None,
                     frozenset(required[word] for word in (*BASE, *DERIVED)) if first else None)


@dataclass(frozen=True)
class FactTokens:
    """Token ids that mark joint's fact-line copies: the question mark before one, the spaces that
    may follow it, the pilots' names that open it, and the full stops that end it; with `words`
    (every base property word) the copies' first property words alone are sourced."""

    question: int
    spaces: frozenset[int]
    names: frozenset[int]
    stops: frozenset[int]
    words: frozenset[int] | None = None  # the property words: with them, only each copy's first one


FACT_TARGETS = ("lines", "first_words")  # every token of a fact-line copy after the name, or its first word


def joint_fact_tokens(tokenizer, target: str = "lines") -> FactTokens:
    """Joint's `FactTokens` as `tokenizer` writes them, for `target` (one of FACT_TARGETS); the
    question mark, every pilot name and (for "first_words") every base property must be one token each."""
    from clover.data.tasks.joint import BASE
    from clover.data.tasks.vocab import FIRST_NAMES

    if target not in FACT_TARGETS:
        raise ValueError(f"fact target {target!r} must be one of {FACT_TARGETS}")
    first = target == "first_words"
    required = single_tokens(tokenizer, ("?", *FIRST_NAMES, *(BASE if first else ())), "fact_copy")
    return FactTokens(required["?"], one_token_ids(tokenizer, (" ", "\n")),
                      frozenset(required[name] for name in FIRST_NAMES), full_stops(tokenizer),
                      frozenset(required[word] for word in BASE) if first else None)


def fact_copy_spans(response: list[int], tokens: FactTokens):
    """(first, stop): the response indices of each fact-line copy's tokens after its name and the space
    after it, through its full stop: a sentence after a question mark (and a space) that a pilot's
    name opens. (The space after the name is the question's too: `Is Jon insured?`.)"""
    for j, stop in opened_sentences(response, tokens.question, tokens.stops):
        name = j + 1 + (response[j + 1] in tokens.spaces)
        if name < stop and response[name] in tokens.names:
            yield name + 1 + (response[name + 1] in tokens.spaces), stop


def fact_line_sources(batch: Batch, tokens: FactTokens) -> torch.Tensor:
    """[N, R] long: `copy_sources` kept on the tokens of fact-line copies after the name
    (`fact_copy_spans`), or with `tokens.words` on each copy's first property word, -1 elsewhere."""
    sources = copy_sources(batch)
    kept = torch.zeros_like(sources, dtype=torch.bool)
    for n, response in enumerate(batch.response_ids.tolist()):
        for first, stop in fact_copy_spans(response, tokens):
            if tokens.words is None:
                kept[n, first:stop + 1] = True
            elif (word := first_index(response, tokens.words, first, stop)) is not None:
                kept[n, word] = True
    return torch.where(kept, sources, torch.full_like(sources, -1))


def key_sources(batch: Batch, tokens: KeyTokens) -> torch.Tensor:
    """[N, R] long: for each targeted response token of a keyed copy (after `key :`, to its full stop
    included; with `tokens.opener`, of a sentence after its opener, to its full stop included, whose
    key is its last word), the prompt column of that key where it ends a prompt sentence (`... is
    cleared.`); -1 for every other token, and for a key that ends no prompt sentence."""
    rows = []
    for prompt, response in zip(batch.prompt_ids.tolist(), batch.response_ids.tolist()):
        ends = {t: c for c, (t, after) in enumerate(zip(prompt, prompt[1:]))
                if t in tokens.keys and after in tokens.stops}
        rows.append(sentence_key_row(response, ends, tokens) if tokens.opener is not None
                    else keyed_row(response, ends, tokens))
    out = torch.tensor(rows, dtype=torch.long, device=batch.response_ids.device).view_as(batch.response_ids)
    return torch.where(batch.target_mask, out, torch.full_like(out, -1))


def keyed_row(response: list[int], ends: dict[int, int], tokens: KeyTokens) -> list[int]:
    """`key_sources`' row for keyed copies (`key : ...`); `ends`: key -> its prompt column."""
    row, key = [-1] * len(response), None  # key: that of the copy being walked, if any
    for j in range(2, len(response)):
        if key is None and response[j - 1] == tokens.colon and response[j - 2] in ends:
            key = response[j - 2]
        if key is not None:
            row[j] = ends[key]
            key = None if response[j] in tokens.stops else key
    return row


def opened_sentences(ids: list[int], opener: int, stops: frozenset[int]):
    """(opener index, full stop index) of each sentence of `ids` that opens with `opener` (a rule's
    `Anyone`, a fact-line copy's question mark) and ends with one of `stops` (the next one after it)."""
    for j, t in enumerate(ids):
        if t == opener:
            stop = first_index(ids, stops, j + 1)
            if stop is not None:
                yield j, stop


def sentence_key_row(response: list[int], ends: dict[int, int], tokens: KeyTokens) -> list[int]:
    """`key_sources`' row for sentence copies (`Anyone ... key .`), or with `tokens.conditions` for
    their first conditions only; `ends`: key -> its prompt column."""
    row = [-1] * len(response)
    for j, stop in opened_sentences(response, tokens.opener, tokens.stops):
        if response[stop - 1] not in ends:
            continue
        if tokens.conditions is None:
            row[j + 1:stop + 1] = [ends[response[stop - 1]]] * (stop - j)
            continue
        first = first_index(response, tokens.conditions, j + 1, stop - 1)
        if first is not None:
            row[first] = ends[response[stop - 1]]
    return row


class RecordedAttention:
    """Within `with`, every full-attention layer of `model` records (query, keys, mask, num_causal)
    of each call, in call order: one list per layer. With `outputs`, each call's gated head outputs
    (the input of `o_proj`, [N, T, H * D]) are kept too, in `self.outputs`: one list per layer."""

    def __init__(self, model, outputs: bool = False):
        self.layers = [m for m in model.modules() if isinstance(m, GatedAttention)]
        self.keep_outputs, self.outputs, self.handles = outputs, [], []

    def __enter__(self) -> list[list]:
        self.outputs = [[] for _ in self.layers]
        for layer, kept in zip(self.layers, self.outputs):
            layer.recorded = []
            if self.keep_outputs:
                self.handles.append(layer.o_proj.register_forward_pre_hook(
                    lambda module, args, kept=kept: kept.append(args[0])))
        return [layer.recorded for layer in self.layers]

    def __exit__(self, *exc):
        for layer in self.layers:
            layer.recorded = None
        for handle in self.handles:
            handle.remove()
        self.handles = []


def causal_rows(calls: list, prompt_len: int, r: int):
    """(call index, its rows, lo, hi) for each recorded call (`source_log_weights`) that predicts
    response tokens: its causal query rows `rows` predict tokens lo..hi - 1."""
    for c, (query, keys, _, num_causal) in enumerate(calls):
        first = keys.shape[2] - query.shape[2]  # column of the call's first token
        # the call's causal rows predict tokens j = column - P + 1; keep those in [0, R)
        lo, hi = max(0, first - prompt_len + 1), min(r, first + num_causal - prompt_len + 1)
        if lo < hi:
            yield c, slice(lo + prompt_len - 1 - first, hi + prompt_len - 1 - first), lo, hi


def source_log_weights(calls: list, sources: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """[N, H, R]: one layer's log attention weight, at each head, from the causal query that
    predicts response token j (column P + j - 1) on the token's source column (clamped where it has
    none). `calls` are the layer's recorded calls over [prompt, response] in order: one causal
    forward, or the training loop's fused ones (loss.py), whose causal rows are the tokens they
    append to the cache, the first `num_causal`, at the columns after the cache's."""
    r = sources.shape[1]
    out = []
    for c, rows, lo, hi in causal_rows(calls, prompt_len, r):
        query, keys, mask, _ = calls[c]
        scores = attention_scores(query[:, :, rows], keys, mask[:, :, rows], query.shape[-1] ** -0.5)
        index = sources[:, lo:hi].clamp(min=0)[:, None, :, None].expand(-1, scores.shape[1], -1, 1)
        out.append(scores.log_softmax(dim=-1).gather(-1, index).squeeze(-1))  # [N, H, hi - lo]
    weights = torch.cat(out, dim=-1)
    if weights.shape[-1] != r:
        raise ValueError(f"the recorded calls predict {weights.shape[-1]} response tokens, expected {r}")
    return weights


def copy_attention_loss(recorded: list[list], sources: torch.Tensor, prompt_len: int,
                        heads: Sequence[tuple[int, int]] = ()) -> torch.Tensor:
    """Mean over sourced tokens of -max over `heads` ((full-attention layer, head) pairs; empty:
    every head of every recorded layer) of the log weight on the token's source (module doc); 0
    when no token has a source."""
    sourced = sources >= 0
    if not sourced.any():
        return recorded[0][0][0].new_zeros((), dtype=torch.float)
    num_heads = recorded[0][0][0].shape[1]
    pairs = list(heads) or [(layer, head) for layer in range(len(recorded)) for head in range(num_heads)]
    for layer, head in pairs:
        if not (0 <= layer < len(recorded) and 0 <= head < num_heads):
            raise ValueError(f"copy head {(layer, head)} is not one of the model's {len(recorded)} "
                             f"full-attention layers x {num_heads} heads")
    weights = {layer: source_log_weights(recorded[layer], sources, prompt_len) for layer, _ in pairs}
    chosen = torch.stack([weights[layer][:, head] for layer, head in pairs], dim=1)  # [N, heads, R]
    return -chosen.max(dim=1).values[sourced].mean()


def copy_value_loss(recorded: list[list], outputs: list[list], o_projs: Sequence[torch.nn.Linear],
                    sources: torch.Tensor, targets: torch.Tensor, prompt_len: int,
                    heads: Sequence[tuple[int, int]], embeddings: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each sourced response token (`targets` [N, R] where `sources` >= 0) read
    from what `heads` write together into the residual stream at the causal query that predicts it
    (their gated outputs through their columns of `o_proj`): scored against every token's embedding
    [V, D] (detached) by cosine similarity times `SCALE`, as the owner loss reads (line_owner.py).
    A head that looks at the right place and writes nothing of it leaves the copy to the rest of
    the model; this loss asks the head to write it. 0 when no token has a source."""
    if not heads:
        raise ValueError("the copy value loss needs the copy heads named (train.copy_heads)")
    sourced = sources >= 0
    if not sourced.any():
        return recorded[0][0][0].new_zeros((), dtype=torch.float)
    r, written = sources.shape[1], 0
    for layer, head in heads:
        dim = recorded[layer][0][0].shape[-1]
        columns = slice(head * dim, (head + 1) * dim)
        calls = causal_rows(recorded[layer], prompt_len, r)
        gated = torch.cat([outputs[layer][c][:, rows, columns] for c, rows, _, _ in calls], dim=1)  # [N, R, dim]
        written = written + gated @ o_projs[layer].weight[:, columns].T  # [N, R, D]
    words = F.normalize(embeddings.detach().float(), dim=-1)
    logits = SCALE * F.normalize(written[sourced].float(), dim=-1) @ words.T
    return F.cross_entropy(logits, targets[sourced])
