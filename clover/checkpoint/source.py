"""What a conversion reads from a source checkpoint's configs: the text-model fields and token ids.

Accepted sources: `Qwen3_5MoeForCausalLM` (`model_type` `qwen3_5_moe_text`), the multimodal
`Qwen3_5MoeForConditionalGeneration` (`qwen3_5_moe`, text fields under `text_config`), or a Clover
checkpoint (`clover_moe`, re-converted).
"""

import json
from dataclasses import dataclass
from pathlib import Path

SOURCE_MODEL_TYPES = ("qwen3_5_moe_text", "qwen3_5_moe", "clover_moe")
# keys of config.json that describe the file or another model, not the text backbone
_NOT_BACKBONE = ("architectures", "auto_map", "model_type", "transformers_version", "_name_or_path",
                 "text_config", "vision_config", "dtype", "torch_dtype", "image_token_id", "video_token_id",
                 "vision_start_token_id", "vision_end_token_id")
_TOKEN_ID_KEYS = ("eos_token_id", "pad_token_id", "bos_token_id")


@dataclass(frozen=True)
class SourceConfig:
    backbone: dict  # text-model fields, ready for CloverMoeConfig(**backbone)
    dtype: str | None  # the stored dtype the config declares, if any
    token_ids: dict  # eos/pad/bos ids: generation_config.json first, then config.json
    mask_token_id: int | None  # set only when the source is already a Clover checkpoint


def _load_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def read_source_config(src: str | Path) -> SourceConfig:
    """Raise FileNotFoundError without config.json, ValueError for a model type not listed above."""
    src = Path(src)
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src} has no config.json")
    top = _load_json(src / "config.json")
    if top.get("model_type") not in SOURCE_MODEL_TYPES:
        raise ValueError(f"{src} holds a {top.get('model_type')!r} checkpoint; convert reads "
                         f"{', '.join(SOURCE_MODEL_TYPES)}")
    text = top.get("text_config") or top
    backbone = {k: v for k, v in text.items() if k not in _NOT_BACKBONE and k not in _TOKEN_ID_KEYS}
    generation = _load_json(src / "generation_config.json")
    token_ids = {}
    for key in _TOKEN_ID_KEYS:
        for source in (generation, text, top):
            if source.get(key) is not None:
                token_ids[key] = source[key]
                break
    dtype = text.get("dtype") or text.get("torch_dtype") or top.get("dtype") or top.get("torch_dtype")
    mask_id = top.get("mask_token_id") if top.get("model_type") == "clover_moe" else None
    return SourceConfig(backbone, dtype, token_ids, mask_id)
