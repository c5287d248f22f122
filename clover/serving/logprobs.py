"""OpenAI `logprobs` of a response, from what the engine reports per committed token.

A block-diffusion token's log-probability is the one it was committed with: read from the processed
distribution (controls applied, before temperature) of the denoising step that filled its position,
the same distribution its confidence came from; the alternatives are that step's most likely tokens.
EOS tokens are left out, as they are of the text, and so are tokens past a stop string.
"""

from .schemas import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob

MAX_TOP_LOGPROBS = {"chat": 20, "completions": 5}  # OpenAI's limits


def _shown(tokenizer, token_ids: list[int], logprobs: list, eos_ids: set[int], text: str) -> list:
    """(token text, token id, logprob entry) of the response tokens that make up `text`."""
    shown, offset = [], 0
    for token_id, entry in zip(token_ids, logprobs):
        if token_id in eos_ids or offset >= len(text):
            continue
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
                        top: int, start_offset: int = 0) -> CompletionLogprobs:
    shown = _shown(tokenizer, token_ids, logprobs, eos_ids, text)
    return CompletionLogprobs(
        tokens=[piece for piece, _, _ in shown],
        token_logprobs=[lp for _, _, (lp, _) in shown],
        top_logprobs=[{t.token: t.logprob for t in _top(tokenizer, alternatives, top)}
                      for _, _, (_, alternatives) in shown],
        text_offset=[start_offset + offset for _, offset, _ in shown])
