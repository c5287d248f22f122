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
"""

from .schemas import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob

MAX_TOP_LOGPROBS = {"chat": 20, "completions": 5}  # OpenAI's limits


def _shown(tokenizer, token_ids: list[int], logprobs: list, eos_ids: set[int], text: str,
           keep_eos: bool = False) -> list:
    """(token text, offset in `text`, logprob entry) of the response tokens that make up `text`,
    and with `keep_eos` the EOS that ended it (at offset len(text); not one after a stop string)."""
    shown, offset = [], 0
    for token_id, entry in zip(token_ids, logprobs):
        if token_id in eos_ids:
            if keep_eos and offset == len(text):
                shown.append((tokenizer.decode([token_id], skip_special_tokens=False), offset, entry))
            break
        if offset >= len(text):  # past a stop string
            break
        piece = tokenizer.decode([token_id], skip_special_tokens=False)
        shown.append((piece, offset, entry))
        offset += len(piece)
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
                  top: int) -> ChatLogprobs:
    content = [ChatTokenLogprob(token=piece, logprob=lp, bytes=list(piece.encode()),
                                top_logprobs=_top(tokenizer, alternatives, top))
               for piece, _, (lp, alternatives) in _shown(tokenizer, token_ids, logprobs, eos_ids, text)]
    return ChatLogprobs(content=content)


def completion_logprobs(tokenizer, token_ids: list[int], logprobs: list, eos_ids: set[int], text: str,
                        top: int, echo: str = "", prompt_ids: list[int] | None = None,
                        prompt_logprobs: list | None = None) -> CompletionLogprobs:
    """The response's tokens at offsets after `echo`; with `prompt_logprobs` (per prompt token,
    None for the first) the prompt's tokens first, at offsets in `echo`."""
    shown = [(piece, len(echo) + offset, entry)
             for piece, offset, entry in _shown(tokenizer, token_ids, logprobs, eos_ids, text, keep_eos=True)]
    if prompt_logprobs is not None:
        shown = _prompt_shown(tokenizer, prompt_ids, prompt_logprobs) + shown
    return CompletionLogprobs(
        tokens=[piece for piece, _, _ in shown],
        token_logprobs=[None if entry is None else entry[0] for _, _, entry in shown],
        top_logprobs=[None if entry is None else {t.token: t.logprob for t in _top(tokenizer, entry[1], top)}
                      for _, _, entry in shown],
        text_offset=[offset for _, offset, _ in shown])
