"""What the HTTP layer needs once the model is up, and how to build it (from objects or a dir)."""

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from clover.model.generation_config import DecodeConfig

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
                     metrics: ServingMetrics | None = None) -> "Runtime":
        """Start an engine over an in-memory model and tokenizer (tests, benchmarks)."""
        engine = Engine(model, tokenizer, EngineConfig() if config is None else config, metrics).start()
        return cls(engine, AsyncEngine(engine), tokenizer, server_defaults(model, tokenizer), model.config)

    def shutdown(self) -> None:
        self.engine.shutdown()


DTYPES = {"auto": None, "float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def pick_device(device: str) -> torch.device:
    if device != "auto":
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_model_and_tokenizer(model_dir: str | Path, dtype: str = "auto", device: str = "auto"):
    """A Clover checkpoint directory (SPEC §9) -> (model in eval mode, tokenizer)."""
    from clover.checkpoint.tokenizer_load import load_tokenizer

    from clover.model import CloverMoeForCausalLM

    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r} is not one of {sorted(DTYPES)}")
    target = pick_device(device)
    torch_dtype = DTYPES[dtype] or (torch.bfloat16 if target.type == "cuda" else torch.float32)
    log.info("loading %s (%s on %s)", model_dir, torch_dtype, target)
    model = CloverMoeForCausalLM.from_pretrained(str(model_dir), dtype=torch_dtype, device_map=str(target))
    tokenizer = load_tokenizer(model_dir, local_files_only=True)
    return model.eval(), tokenizer
