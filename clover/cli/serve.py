"""`clover serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn), loopback by default.

    clover serve --model DIR --port 8000 --api-key sk-local
    curl -s localhost:8000/v1/chat/completions -H 'Authorization: Bearer sk-local' \\
         -d '{"model": "clover", "messages": [{"role": "user", "content": "Hi"}]}'

The port opens at once; until the model is loaded, /health and /v1 answer 503. One log line per
request (id, tokens, forwards, latency); metrics at /metrics.
"""

import argparse
import logging
import os
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint directory (default: the embedded model)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get("CLOVER_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 (default: $CLOVER_API_KEY, else none)")
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: dir name)")
    p.add_argument("--max-batch-size", type=int, default=32, help="requests decoded together")
    p.add_argument("--max-queue", type=int, default=256, help="waiting requests before 429")
    p.add_argument("--max-step-tokens", type=int, default=2048,
                   help="prompt tokens prefilled per engine step, over all requests (long prompts no longer "
                        "stall short ones)")
    p.add_argument("--prefix-cache-mb", type=float, default=256.0,
                   help="memory for cached prompt prefixes, LRU (0 = off)")
    p.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024, help="larger bodies get 413")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ...")
    p.add_argument("--threads", type=int, default=None, help="CPU threads of the engine (default: torch's)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(run=run)


def model_dir(path: str | None) -> Path:
    if path is not None:
        return Path(path)
    import clover

    return Path(clover.default_model_dir())


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from clover.serving import EngineConfig, Runtime, SchedulerConfig, ServerConfig, create_app
    from clover.serving.runtime import DTYPES, load_model_and_tokenizer

    for name in ("max_batch_size", "max_queue", "max_body_bytes", "port", "max_step_tokens"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)} must be positive")
    if args.dtype not in DTYPES:
        raise ValueError(f"--dtype {args.dtype!r} is not one of {sorted(DTYPES)}")
    directory = model_dir(args.model)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"no Clover checkpoint at {directory} (config.json missing)")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.prefix_cache_mb < 0:
        raise ValueError(f"--prefix-cache-mb={args.prefix_cache_mb} must be >= 0 (0 turns the cache off)")
    scheduler = SchedulerConfig(args.max_batch_size, args.max_queue, max_step_tokens=args.max_step_tokens)
    engine_config = EngineConfig(scheduler, num_threads=args.threads, prefix_cache_mb=args.prefix_cache_mb)
    server_config = ServerConfig(args.served_model_name or directory.resolve().name, args.api_key,
                                 args.max_body_bytes)

    def load(metrics):
        model, tokenizer = load_model_and_tokenizer(directory, args.dtype, args.device)
        return Runtime.from_objects(model, tokenizer, engine_config, metrics)

    server: uvicorn.Server | None = None

    def stop(message: str) -> None:  # a server without a model only answers 503: exit instead
        server.should_exit = True

    app = create_app(server_config, load, on_load_error=stop)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           access_log=False))
    server.run()
    if app.state.slot.error is not None:
        raise ValueError(f"could not load {directory}: {app.state.slot.error}")
    return 0
