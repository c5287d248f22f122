"""`clover serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn), loopback by default.

    clover serve --model DIR --port 8000 --api-key sk-local
    curl -s localhost:8000/v1/chat/completions -H 'Authorization: Bearer sk-local' \\
         -d '{"model": "clover", "messages": [{"role": "user", "content": "Hi"}]}'

The port opens at once; until the model is loaded, /health and /v1 answer 503. One log line per
request (id, tokens, forwards, latency); metrics at /metrics; vLLM's /tokenize and /detokenize
(these, like /v1, behind the API key when one is set); /docs only with --docs. Slow or idle connections are closed (--head-timeout, --body-timeout,
--keep-alive-timeout, --max-connections). SIGTERM drains running requests for up to
--shutdown-timeout seconds, then exits 0.
"""

import argparse
import logging
import os

from .common import add_block_rule_arguments
from .model_options import add_model_arguments, load_options, model_dir


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get("CLOVER_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1, /tokenize, /detokenize and /metrics "
                        "(default: $CLOVER_API_KEY, else none)")
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: dir name)")
    p.add_argument("--max-batch-size", type=int, default=32, help="requests decoded together")
    p.add_argument("--max-queue", type=int, default=256, help="waiting requests before 429")
    p.add_argument("--max-step-tokens", type=int, default=2048,
                   help="prompt tokens prefilled per engine step, over all requests (long prompts no longer "
                        "stall short ones)")
    p.add_argument("--step-attention-tokens", type=int, default=2048,
                   help="a prompt token at context c counts 1 + c/N against --max-step-tokens, so pieces deep "
                        "into a long prompt are shorter (0 = count tokens only)")
    p.add_argument("--prefill-share", type=float, default=1 / 3,
                   help="share of engine time a long prompt's pieces may take while other requests decode, "
                        "in (0, 1]; 1 = no cap (default 1/3: decoding rows first)")
    p.add_argument("--prefix-cache-mb", type=float, default=256.0,
                   help="memory for cached prompt prefixes, LRU (0 = off)")
    p.add_argument("--cache-slot-tokens", type=int, default=None,
                   help="cache positions one request may use (prompt + max_tokens + 2 blocks); longer requests "
                        "are refused (default: the model's context + scratch). Slots are allocated as requests "
                        "need them and reused")
    p.add_argument("--mode", default="block_diffusion", choices=["block_diffusion", "ar", "self_spec"],
                   help="decoding mode of requests that do not name one in their 'mode' field "
                        "(default: block_diffusion)")
    add_block_rule_arguments(p, "of requests that name none in their 'fallback' / 'fill' field")
    p.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024, help="larger bodies get 413")
    p.add_argument("--threads", type=int, default=None, help="CPU threads of the engine (default: torch's)")
    p.add_argument("--docs", action="store_true", help="serve /docs and /openapi.json (off by default)")
    p.add_argument("--shutdown-timeout", type=int, default=30,
                   help="seconds SIGTERM waits for running requests before cancelling them (default 30)")
    p.add_argument("--head-timeout", type=float, default=10.0,
                   help="seconds a connection may take to send a request's headers (default 10)")
    p.add_argument("--body-timeout", type=float, default=30.0,
                   help="seconds a request body may take to arrive, else 408 (default 30)")
    p.add_argument("--keep-alive-timeout", type=int, default=5, help="idle keep-alive seconds (default 5)")
    p.add_argument("--max-connections", type=int, default=1024,
                   help="open connections served at once; requests beyond get 503 (default 1024)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from clover.loading import load_model_and_tokenizer
    from clover.serving import EngineConfig, Runtime, SchedulerConfig, ServerConfig, create_app
    from clover.serving.http_server import ConnectionLimits, Server, server_config

    for name in ("max_batch_size", "max_queue", "max_body_bytes", "port", "head_timeout", "body_timeout",
                 "keep_alive_timeout", "max_connections", "max_step_tokens"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)} must be positive")
    if args.shutdown_timeout < 0:
        raise ValueError(f"--shutdown-timeout={args.shutdown_timeout} must be >= 0")
    directory, options = model_dir(args, hub_ok=False), load_options(args)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.cache_slot_tokens is not None and args.cache_slot_tokens <= 0:
        raise ValueError(f"--cache-slot-tokens={args.cache_slot_tokens} must be positive")
    if args.prefix_cache_mb < 0:
        raise ValueError(f"--prefix-cache-mb={args.prefix_cache_mb} must be >= 0 (0 turns the cache off)")
    if args.step_attention_tokens < 0:
        raise ValueError(f"--step-attention-tokens={args.step_attention_tokens} must be >= 0 (0 = count tokens only)")
    if not 0 < args.prefill_share <= 1:
        raise ValueError(f"--prefill-share={args.prefill_share} must be in (0, 1] (1 = no cap)")
    scheduler = SchedulerConfig(args.max_batch_size, args.max_queue, max_step_tokens=args.max_step_tokens,
                                attention_tokens=args.step_attention_tokens or None,
                                prefill_share=None if args.prefill_share == 1 else args.prefill_share)
    engine_config = EngineConfig(scheduler, num_threads=args.threads, prefix_cache_mb=args.prefix_cache_mb,
                                 slot_tokens=args.cache_slot_tokens)
    config = ServerConfig(args.served_model_name or directory.resolve().name, args.api_key, args.max_body_bytes,
                          args.body_timeout, args.docs)
    limits = ConnectionLimits(args.head_timeout, args.keep_alive_timeout, args.max_connections,
                              args.shutdown_timeout)

    def load(metrics):
        model, tokenizer = load_model_and_tokenizer(directory, options)
        return Runtime.from_objects(model, tokenizer, engine_config, metrics, mode=args.mode,
                                    fallback=args.fallback, fill=args.fill)

    server: Server | None = None

    def stop(message: str) -> None:  # a server without a model only answers 503: exit instead
        server.should_exit = True

    app = create_app(config, load, on_load_error=stop)
    server = Server(server_config(app, args.host, args.port, limits, args.log_level))
    server.run()
    if app.state.slot.error is not None:
        raise ValueError(f"could not load {directory}: {app.state.slot.error}")
    return 0
