"""`POST /tokenize` and `POST /detokenize`, as vLLM serves them.

/tokenize takes a `prompt` (tokenized as is) or chat `messages` (rendered with the chat template,
exactly as chat completions render them, then tokenized) and answers `tokens`, `count` and
`max_model_len` (and `token_strs` with `return_token_strs`). /detokenize takes `tokens` and
answers their text (`prompt`), special tokens kept. Both check `model` when one is given.
"""

from starlette.concurrency import run_in_threadpool

from .admission import ServerConfig, check_model
from .errors import bad_request
from .prompts import chat_prompt, text_ids
from .runtime import Runtime
from .schemas import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse


def tokenize_ids(tokenizer, req: TokenizeRequest, max_model_len: int) -> list[int]:
    if req.messages is not None:
        prompt = chat_prompt(tokenizer, req, max_model_len, req.add_generation_prompt, req.continue_final_message)
        if not req.add_special_tokens:
            return prompt.ids
        return tokenizer.encode(prompt.text, add_special_tokens=True)
    return text_ids(tokenizer, req.prompt, max_model_len, req.add_special_tokens is not False)


async def create_tokenize(req: TokenizeRequest, rt: Runtime, cfg: ServerConfig) -> TokenizeResponse:
    if req.model is not None:
        check_model(req.model, cfg)
    ids = await run_in_threadpool(tokenize_ids, rt.tokenizer, req, rt.max_model_len)  # off the loop
    strs = rt.tokenizer.convert_ids_to_tokens(ids) if req.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=rt.max_model_len, tokens=ids, token_strs=strs)


def check_token_ids(ids: list[int], vocab_size: int, param: str = "tokens") -> None:
    """Refuse the first id outside the vocabulary, naming it, its place and the vocabulary size."""
    for i, token_id in enumerate(ids):
        if not 0 <= token_id < vocab_size:
            raise bad_request(f"'{param}.{i}' is {token_id}, which is not a token id of this model: ids go "
                              f"from 0 to {vocab_size - 1} (vocabulary size {vocab_size})", f"{param}.{i}")


async def create_detokenize(req: DetokenizeRequest, rt: Runtime, cfg: ServerConfig) -> DetokenizeResponse:
    if req.model is not None:
        check_model(req.model, cfg)
    check_token_ids(req.tokens, rt.vocab_size)
    text = await run_in_threadpool(rt.tokenizer.decode, req.tokens, skip_special_tokens=False)
    return DetokenizeResponse(prompt=text)
