"""Shared helpers for the serving tests: a tiny tokenizer, a tiny peaked model, a scripted model,
and a server on a free loopback port (uvicorn in a thread of the test process)."""

import socket
import threading
import time

import torch

from clover.data.tokenizer import train_tokenizer
from clover.serving.admission import request_config
from clover.serving.http_server import ConnectionLimits, Server, server_config
from clover.serving.runtime import server_defaults
from clover.serving.scheduler import EngineRequest

from tiny import tiny_config, tiny_model

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "hello world, how are you today? I am fine, thank you.",
    "def add(x, y):\n    return x + y\n",
    "What is the weather in Paris? It is sunny in Paris today.",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "Let me think about this step by step. The answer is 4.",
] * 10


def make_tokenizer():
    return train_tokenizer(TEXTS, vocab_size=300)


def make_model(tokenizer, seed: int = 0, head_scale: float = 8.0):
    """A random tiny model over the tokenizer's vocabulary; the lm_head is scaled so the
    distributions are peaked (many positions pass the threshold)."""
    model = tiny_model(seed=seed, vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id)
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    return model


def request_settings(model, tok, **overrides):
    """A request's generation settings: the server's defaults for this model with `overrides`."""
    return request_config(server_defaults(model, tok), overrides, model.config.vocab_size)


def generate_like(model, ids: list[int], cfg) -> list[int]:
    """`model.generate` of one prompt with a request's settings `cfg` (those the engine's greedy
    decoding reads), cut after the first EOS as the engine stops."""
    out = model.generate(torch.tensor([ids]), max_new_tokens=cfg.max_new_tokens, block_size=cfg.block_size,
                         threshold=cfg.threshold, fallback=cfg.fallback, fill=cfg.fill, mode=cfg.mode,
                         eos_token_id=list(cfg.eos_token_id), think_start_token_id=cfg.think_start_token_id,
                         think_end_token_id=cfg.think_end_token_id)
    tokens = out[0, len(ids):].tolist()
    eos = [i for i, t in enumerate(tokens) if t in cfg.eos_token_id]
    return tokens[:eos[0] + 1] if eos else tokens


def drive(engine, requests: list[tuple[str, list[int], object]], at_step: dict[str, int] | None = None
          ) -> dict[str, list]:
    """Submit each (id, prompt ids, settings) before engine step `at_step[id]` (default 0), step the
    engine on this thread until idle; id -> its outputs."""
    at_step = at_step or {}
    pending = sorted(requests, key=lambda r: at_step.get(r[0], 0))
    outs, step = {rid: [] for rid, _, _ in requests}, 0
    with torch.inference_mode():
        while pending or engine.scheduler.num_running or engine.scheduler.num_waiting:
            while pending and at_step.get(pending[0][0], 0) <= step:
                rid, ids, config = pending.pop(0)
                engine.submit(EngineRequest(rid, ids, config), outs[rid].append)
            engine.step()
            step += 1
    return outs


def new_tokens(outputs) -> list[int]:
    """The tokens a request's outputs streamed, in order."""
    return [t for o in outputs for t in o.new_token_ids]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(client, timeout: float = 60):
    """Poll `GET /v1/models` until the model has loaded (503 before)."""
    import openai
    deadline = time.time() + timeout
    while True:
        try:
            return client.models.list()
        except openai.APIStatusError as e:
            if e.status_code != 503 or time.time() > deadline:
                raise
            time.sleep(0.05)


class ServerThread:
    """The server `clover serve` runs (uvicorn with `ConnectionLimits`), serving `app` on
    127.0.0.1:<free port> until `stop()`."""

    def __init__(self, app, limits: ConnectionLimits = ConnectionLimits()):
        self.port = free_port()
        self.server = Server(server_config(app, "127.0.0.1", self.port, limits, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ServerThread":
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class ScriptedModel(torch.nn.Module):
    """Follows the model's forward contract and answers every prompt with `respond(prompt_text)`
    followed by `<|im_end|>`, with certainty, so each block is final after one step.

    It keeps real state in its cache-pool slots like the real model: the token ids as the keys of
    its attention layer (written in place, read back per row) and the prompt length in its GDN
    layer's conv state (gathered and written back), so the engine's cache pool is exercised. A
    prompt containing "EXPLODE" makes the forward raise."""

    def __init__(self, tokenizer, respond):
        super().__init__()
        self.tokenizer, self.respond = tokenizer, respond
        self.config = tiny_config(vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id,
                                  num_hidden_layers=2, layer_types=["linear_attention", "full_attention"])
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    @property
    def device(self):
        return self.anchor.device

    def new_cache(self, capacity: int = 0):
        from clover.model import CloverCache
        return CloverCache(self.config.layer_types, capacity)

    def _script(self, prompt_ids: list[int]) -> list[int]:
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        if "EXPLODE" in text:
            raise RuntimeError("scripted failure")
        return self.tokenizer.encode(self.respond(text), add_special_tokens=False) + [self.im_end]

    def forward(self, input_ids, attention_mask=None, past_key_values=None, block_len=None,
                logits_to_keep=0, **kwargs):
        from clover.model import CloverOutput
        cache, block_len = past_key_values, int(block_len or 0)  # a RowsCache over pool slots
        g, t = input_ids.shape
        past, n_causal = cache.get_seq_length(), t - block_len
        gdn, att = cache.layers
        new = input_ids[:, None, :, None].float()  # [G, 1, T, 1]: the ids as attention keys
        ids = [keys[0, 0, :keys.shape[2] - block_len, 0].long().tolist() for keys, _ in att.read(new, new)]
        conv = gdn.conv_state if gdn.conv_state is not None else torch.zeros(g, 1, 1)
        recurrent = gdn.recurrent_state if gdn.recurrent_state is not None else torch.zeros(g, 1, 1, 1)
        prompt_open = recurrent.view(g, 1, 1) == 0  # per row: prompt pieces until the first block
        fed = attention_mask[:, past:past + n_causal].sum(-1).float().view(g, 1, 1)
        conv = conv + torch.where(prompt_open, fed, 0.0)  # per row: prompt length so far
        gdn.write(conv, torch.ones(g, 1, 1, 1) if block_len else recurrent)
        logits = torch.full((g, block_len, self.config.vocab_size), -30.0)
        for row in range(g):
            prompt_len = int(conv[row].item())
            script = self._script(ids[row][:prompt_len])
            done = len(ids[row]) - prompt_len
            for j in range(block_len):
                k = done + j
                logits[row, j, script[k] if k < len(script) else self.im_end] = 30.0
        return CloverOutput(logits=logits, past_key_values=cache)


WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def scripted_answer(prompt: str) -> str:
    """What the scripted model says: a tool call when tools are offered, the weather once the tool
    answered, and a thought before the answer unless thinking was switched off in the prompt."""
    if "<tool_response>" in prompt:
        return "It is sunny in Paris."
    if prompt.endswith('"arguments": '):  # a named tool_choice opened the call
        return '{"city": "Paris"}}\n</tool_call>'
    if prompt.endswith("<tool_call>\n"):  # tool_choice="required" opened the call
        return WEATHER_CALL[len("<tool_call>\n"):]
    if "# Tools" in prompt:
        return WEATHER_CALL
    if prompt.rstrip().endswith("</think>"):
        return "The answer is 4."
    return "<think>\nLet me think.\n</think>\n\nThe answer is 4."


class GatedModel(ScriptedModel):
    """A scripted model whose forwards wait for `gate` (to hold requests in the engine)."""

    def __init__(self, tokenizer, respond=scripted_answer):
        super().__init__(tokenizer, respond)
        self.gate = threading.Event()

    def forward(self, *args, **kwargs):
        self.gate.wait(timeout=60)
        return super().forward(*args, **kwargs)


def serve_model(model, tok, config, engine=None) -> ServerThread:
    """A started server (uvicorn thread) for `model` under `config` (a `ServerConfig`) and `engine`
    (an `EngineConfig`, default one thread), ready to answer; `srv.app` is its app and
    `srv.client` an OpenAI client for it. Stop it with `srv.stop()`."""
    import openai

    from clover.serving import EngineConfig, Runtime, create_app

    engine = engine or EngineConfig(num_threads=1)
    app = create_app(config, lambda metrics: Runtime.from_objects(model, tok, engine, metrics))
    srv = ServerThread(app).start()
    srv.client = openai.OpenAI(api_key=config.api_key or "none", base_url=srv.base_url + "/v1", max_retries=0,
                               timeout=120)
    wait_ready(srv.client)
    srv.app = app
    return srv


def serve_scripted(tok, config, respond=scripted_answer) -> ServerThread:
    """`serve_model` for a `ScriptedModel` answering `respond(prompt)`."""
    return serve_model(ScriptedModel(tok, respond), tok, config)
