"""What the HTTP layer needs once the model is up (the engine over a loaded model and tokenizer)."""

import logging
from dataclasses import dataclass, replace

from clover.model.generation_config import MODES, DecodeConfig

from .async_engine import AsyncEngine
from .engine import Engine, EngineConfig
from .metrics import ServingMetrics
from .params import server_defaults

log = logging.getLogger("clover.serve")


@dataclass
class Runtime:
    engine: Engine
    async_engine: AsyncEngine
    tokenizer: object
    defaults: DecodeConfig
    model_config: object  # the model's config: vocab_size, mask_token_id, max_position_embeddings

    @property
    def max_model_len(self) -> int:
        return self.model_config.max_position_embeddings

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    @classmethod
    def from_objects(cls, model, tokenizer, config: EngineConfig | None = None,
                     metrics: ServingMetrics | None = None, mode: str | None = None) -> "Runtime":
        """Start an engine over an in-memory model and tokenizer (tests, benchmarks). `mode`: the
        decoding mode of requests that name none (default: the checkpoint's, block diffusion)."""
        defaults = server_defaults(model, tokenizer)
        if mode is not None:
            if mode not in MODES:
                raise ValueError(f"mode={mode!r} is invalid: must be one of {list(MODES)}")
            defaults = replace(defaults, mode=mode)
        engine = Engine(model, tokenizer, EngineConfig() if config is None else config, metrics).start()
        return cls(engine, AsyncEngine(engine), tokenizer, defaults, model.config)

    def shutdown(self) -> None:
        self.engine.shutdown()
