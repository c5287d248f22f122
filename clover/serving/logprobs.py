"""OpenAI `logprobs` of a response, from what the engine reports per committed token.

A block-diffusion token's log-probability is the one it was committed with: read from the processed
distribution (controls applied, before temperature) of the denoising step that filled its position,
the same distribution its confidence came from; the alternatives are that step's most likely tokens.
Tokens past a stop string are left out. EOS tokens are left out of chat logprobs, as they are of
the text; completions list them (OpenAI's legacy completions show `<|endoftext|>` too), so that a
client that counts tokens finds each one where it expects it: lm-eval scores a continuation as the
`echo`ed tokens between the context and the one generated token, whatever that token is.

`echo` with `logprobs` puts the prompt's tokens first: each with its log-probability given the
tokens before it from one causal pass (the first has none: null, as in OpenAI's), so likelihood
evaluation works over the API.

A stream carries in each chunk the logprobs of the tokens that start in the text it carries (a
`Cursor` per choice), so a stream's logprobs put together are the non-streamed ones.
"""

from dataclasses import dataclass

from .schemas import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob

MAX_TOP_LOGPROBS = {"chat": 20, "completions": 5}  # OpenAI's limits


@dataclass
class Cursor:
    """How far a streamed response's logprobs have been shown: the tokens passed and the text
    offset after them. A stream shows each token once, when the text it starts in is sent."""

    tokens: int = 0
    offset: int = 0


def _shown(tokenizer, token_ids: list[int], logprobs: list, eos_ids: set[int], text: str,
           keep_eos: bool = False, cursor: Cursor | None = None) -> list:
    """(token text, offset in `text`, logprob entry) of the response tokens that make up `text`,
    and with `keep_eos` the EOS that ended it (at offset len(text); not one after a stop string).
    With a `cursor`, only the tokens after it, which it then passes; `text` may be a prefix of the
    final text (what a stream has sent), the tokens that start past it wait for a later call."""
    at = cursor or Cursor()
    shown = []
    for token_id, entry in zip(token_ids[at.tokens:], logprobs[at.tokens:]):
        if token_id in eos_ids:
            if keep_eos and at.offset == len(text):
                shown.append((tokenizer.decode([token_id], skip_special_tokens=False), at.offset, entry))
                at.tokens += 1
            break
        if at.offset >= len(text):  # past a stop string, or not sent yet
            break
        piece = tokenizer.decode([token_id], skip_special_tokens=False)
        shown.append((piece, at.offset, entry))
        at.tokens, at.offset = at.tokens + 1, at.offset + len(piece)
    return shown


def _prompt_shown(tokenizer, prompt_ids: list[int], prompt_logprobs: list) -> list:
    """(token text, offset in the echoed prompt, logprob entry or None) of every prompt token."""
    shown, offset = [], 0
    for token_id, entry in zip(prompt_ids, prompt_logprobs):
        piece = tokenizer.decode([token_id], skip_special_tokens=False)
        shown.append((piece, offset, entry))
        offset += len(piece)
    return shown


def _top(tokenizer, alternatives: list[tuple[int, float]], k: int) -> list[TopLogprob]:
    out = []
    for token_id, logprob in alternatives[:k]:
        piece = tokenizer.decode([token_id], skip_special_tokens=False)
        out.append(TopLogprob(token=piece, logprob=logprob, bytes=list(piece.encode())))
    return out


def chat_logprobs(tokenizer, token_ids: list[int], logprobs: list, eos_ids: set[int], text: str,
                  top: int, cursor: Cursor | None = None) -> ChatLogprobs:
    """The logprobs of the tokens that make up `text`; with a `cursor`, of those after it."""
    content = [ChatTokenLogprob(token=piece, logprob=lp, bytes=list(piece.encode()),
                                top_logprobs=_top(tokenizer, alternatives, top))
               for piece, _, (lp, alternatives) in _shown(tokenizer, token_ids, logprobs, eos_ids, text,
                                                          cursor=cursor)]
    return ChatLogprobs(content=content)


def _completion_entries(tokenizer, shown: list, top: int) -> CompletionLogprobs:
    return CompletionLogprobs(
        tokens=[piece for piece, _, _ in shown],
        token_logprobs=[None if entry is None else entry[0] for _, _, entry in shown],
        top_logprobs=[None if entry is None else {t.token: t.logprob for t in _top(tokenizer, entry[1], top)}
                      for _, _, entry in shown],
        text_offset=[offset for _, offset, _ in shown])


def completion_logprobs(tokenizer, token_ids: list[int], logprobs: list, eos_ids: set[int], text: str,
                        top: int, echo: str = "", prompt_ids: list[int] | None = None,
                        prompt_logprobs: list | None = None, cursor: Cursor | None = None,
                        final: bool = True) -> CompletionLogprobs:
    """The response's tokens at offsets after `echo`; with `prompt_logprobs` (per prompt token,
    None for the first) the prompt's tokens first, at offsets in `echo`. A stream passes its
    `cursor` and `final` (the EOS that ended the text is listed only once it is final)."""
    shown = [(piece, len(echo) + offset, entry)
             for piece, offset, entry in _shown(tokenizer, token_ids, logprobs, eos_ids, text, final, cursor)]
    if prompt_logprobs is not None:
        shown = _prompt_shown(tokenizer, prompt_ids, prompt_logprobs) + shown
    return _completion_entries(tokenizer, shown, top)
