"""`from_pretrained` / `save_pretrained` in the Clover checkpoint layout (SPEC §9).

Loading builds the model with parameters on `meta`, then maps tensors lazily from the safetensors
files (see `checkpoint_load`). Saving writes a complete, self-loading directory atomically (see
`checkpoint_save`). Both work with `AutoModelForCausalLM` after `import clover` and with
`trust_remote_code=True` in a process that never imports `clover`.
"""

import json
import os
import warnings
from pathlib import Path

import torch
from transformers import GenerationConfig

from .checkpoint_load import checkpoint_dtype, index_checkpoint, load_parameters, params_on_meta, plan_sources
from .checkpoint_names import (CONFIG_FILE, GENERATION_CONFIG_FILE, block_file, is_block_attr,
                               is_fused_experts, split_experts)
from .checkpoint_save import (PendingTensor, atomic_directory, copy_model_code, write_block_files,
                              write_config, write_generation_config, write_weights)
from .generation_config import without_neutral_settings
from .quantized import pack_quantized, quantization_spec, quantize_modules

_HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "revision", "token")
# accepted for compatibility with transformers' loaders; they do not change what this loader does
_SILENT_KWARGS = ("trust_remote_code", "_from_auto", "_from_pipeline", "adapter_kwargs", "proxies",
                  "code_revision", "_commit_hash", "low_cpu_mem_usage", "use_safetensors",
                  "attn_implementation", "weights_only", "key_mapping")
_SNAPSHOT_PATTERNS = ["*.json", "*.safetensors", "*.py", "*.jinja", "*.txt", "*.model", "*.tiktoken"]


def read_generation_config(root: Path, generation_class=GenerationConfig):
    """The checkpoint's generation config, read without the neutral flags that older checkpoints of
    this project carry (`top_k: 0`) and that transformers would warn about on every load."""
    settings = json.loads((root / GENERATION_CONFIG_FILE).read_text(encoding="utf-8"))
    config = generation_class.from_dict(without_neutral_settings(settings))
    config._original_object_hash = hash(config)  # as GenerationConfig.from_pretrained does
    return config


def _resolve_dir(path: str | os.PathLike, kwargs: dict) -> Path:
    """A local checkpoint dir, or a Hub repo id fetched with huggingface_hub (pops hub kwargs)."""
    subfolder = kwargs.pop("subfolder", "") or ""
    hub = {k: kwargs.pop(k) for k in _HUB_KWARGS if k in kwargs}
    root = Path(path)
    if not root.is_dir():
        text = str(path)
        if os.path.isabs(text) or text.startswith(".") or text.count("/") > 1:
            raise FileNotFoundError(f"checkpoint dir {text} does not exist")
        from huggingface_hub import snapshot_download
        root = Path(snapshot_download(str(path), allow_patterns=_SNAPSHOT_PATTERNS, **hub))
    return root / subfolder


def tied_parameters(model) -> dict[str, str]:
    """Parameter name -> the parameter it shares when the config ties embeddings (else empty)."""
    if not model.config.tie_word_embeddings:
        return {}
    return dict(getattr(model, "all_tied_weights_keys", None) or {})


def _check_model_type(root: Path, expected: str) -> None:
    path = root / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{root} has no {CONFIG_FILE}")
    found = json.loads(path.read_text()).get("model_type")
    if found != expected:
        raise ValueError(f"{root} holds a {found!r} checkpoint, not {expected!r}; convert it first with "
                         f"`clover convert {root} DST`")


def _partition(state: dict[str, torch.Tensor], tied: set[str], experts: str):
    """state dict -> (backbone tensors under their checkpoint names, block-mode tensors); tied
    parameters are left out, fused experts split per expert when `experts == "per_expert"`."""
    backbone, block = {}, {}
    for name, tensor in state.items():
        if name in tied:
            continue
        if block_file(name):
            block[name] = tensor
        elif experts == "per_expert" and is_fused_experts(name):
            backbone.update(split_experts(name, tensor))
        else:
            backbone[name] = tensor
    return backbone, block


def resolve_device(device_map) -> torch.device:
    """None/"cpu" -> cpu; "auto" -> cuda:0 when available; an int, str or torch.device -> that
    device; a dict whose values name one device -> that device. Layer splitting is not supported."""
    if isinstance(device_map, dict):
        devices = set(device_map.values())
        if len(devices) != 1:
            raise ValueError(f"device_map={device_map!r} spreads the model over {sorted(map(str, devices))}; "
                             "only a single device is supported")
        device_map = devices.pop()
    if device_map is None:
        return torch.device("cpu")
    if device_map == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if isinstance(device_map, int):
        return torch.device("cuda", device_map)
    return torch.device(device_map)


def _as_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and isinstance(getattr(torch, dtype, None), torch.dtype):
        return getattr(torch, dtype)
    raise ValueError(f"dtype={dtype!r} is not a torch dtype, a dtype name or 'auto'")


class CheckpointMixin:
    """Checkpoint I/O for `CloverMoeForCausalLM` (first in its MRO, so these override transformers')."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *model_args, config=None,
                        dtype=None, device_map=None, **kwargs):
        """Load a Clover checkpoint dir (or Hub repo id).

        dtype: a torch dtype / name, or None / "auto" for the checkpoint's (config `dtype`, else the
        stored one). device_map: None / "cpu", "auto", a device, or a one-device dict. Other keyword
        arguments that name config fields override them (as in transformers). Raises
        FileNotFoundError (missing weights file or shard) or CheckpointError (missing tensor, wrong
        shape) before any tensor data is read. `output_loading_info=True` returns `(model, info)` as
        transformers does (`missing_keys`: block parameters left at their init values because their
        bd_gdn_* file is absent; `unexpected_keys`: stored tensors no parameter reads).
        `quantization_config` is refused (ValueError): quantization is clover's own step after loading."""
        torch_dtype = kwargs.pop("torch_dtype", None)
        dtype = torch_dtype if dtype is None else dtype
        output_loading_info = kwargs.pop("output_loading_info", False)
        if kwargs.get("quantization_config") is not None:
            raise ValueError("from_pretrained(quantization_config=...) is not supported: Clover checkpoints "
                             "load unquantized; quantize the loaded model with clover's own quantization "
                             "(`--quantize`, `clover.loading.LoadOptions(quantize=...)`)")
        kwargs.pop("quantization_config", None)
        root = _resolve_dir(pretrained_model_name_or_path, kwargs)
        if config is None:
            _check_model_type(root, cls.config_class.model_type)
            config, kwargs = cls.config_class.from_pretrained(root, return_unused_kwargs=True, **kwargs)
        for key in _SILENT_KWARGS:
            kwargs.pop(key, None)
        if kwargs:
            warnings.warn(f"from_pretrained ignores {sorted(kwargs)}", stacklevel=2)
        ckpt = index_checkpoint(root)
        if dtype in (None, "auto"):
            dtype = checkpoint_dtype(ckpt, getattr(config, "dtype", None))
        dtype = _as_dtype(dtype)
        with params_on_meta(keep_real=is_block_attr):
            model = cls(config, *model_args)
        if (spec := quantization_spec(config)) is not None:  # a quantized checkpoint: its modules first
            quantize_modules(model, *spec)
        tied = tied_parameters(model)
        expected = {n: tuple(p.shape) for n, p in model.named_parameters() if n not in tied}
        plan = plan_sources(ckpt, expected, tied)
        load_parameters(model, ckpt, plan, dtype, resolve_device(device_map))
        if spec is not None:  # CPU: lay the loaded weights out for torch's int4 / int8 kernels
            pack_quantized(model)
        model.config.dtype = dtype
        model.config._name_or_path = str(pretrained_model_name_or_path)
        if (root / GENERATION_CONFIG_FILE).is_file():
            model.generation_config = read_generation_config(root, getattr(cls, "generation_config_class",
                                                                           GenerationConfig))
        if output_loading_info:  # transformers' shape; a missing tensor raises instead of being listed
            return model.eval(), {"missing_keys": list(plan.defaults), "unexpected_keys": list(plan.unused),
                                  "mismatched_keys": [], "error_msgs": []}
        return model.eval()

    def save_pretrained(self, save_directory: str | os.PathLike, max_shard_size: int | str = "5GB",
                        experts: str = "fused", safe_serialization: bool = True, is_main_process: bool = True,
                        state_dict: dict[str, torch.Tensor] | None = None, **kwargs) -> None:
        """Write a complete checkpoint dir, atomically (a crash leaves the old dir or none).

        Backbone tensors go to `model.safetensors` (or shards of at most `max_shard_size` plus an
        index), experts fused or `per_expert`; block parameters to the two bd_gdn_* files; then
        config.json (with auto_map), generation_config.json and the model code. Other files already in
        `save_directory` (tokenizer, README) are kept; old weights and code are replaced."""
        if not safe_serialization:
            raise ValueError("Clover checkpoints are safetensors only (safe_serialization=True)")
        if experts not in ("fused", "per_expert"):
            raise ValueError(f"experts={experts!r} must be 'fused' or 'per_expert'")
        if kwargs:
            warnings.warn(f"save_pretrained ignores {sorted(kwargs)}", stacklevel=2)
        if not is_main_process:
            return
        state = self.state_dict() if state_dict is None else state_dict
        backbone, block = _partition(state, set(tied_parameters(self)), experts)
        dtype = next((t.dtype for t in backbone.values() if t.is_floating_point()), torch.float32)
        with atomic_directory(save_directory, keep_other_files=True) as tmp:
            write_config(tmp, self.config, type(self).__name__, dtype)
            if getattr(self, "generation_config", None) is not None:
                write_generation_config(tmp, self.generation_config)
            write_weights(tmp, {k: PendingTensor(t.nbytes, lambda t=t: t) for k, t in backbone.items()},
                          max_shard_size)
            write_block_files(tmp, block)
            copy_model_code(tmp)
