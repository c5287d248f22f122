"""A training recipe: one JSON (or YAML) file that says what to train, on what, and how.

    {
      "name": "embedded",
      "output_dir": "runs/embedded",
      "device": "cpu", "num_threads": 2,
      "model": {"config": {<CloverMoeConfig fields>}} | {"init": "path/to/clover-checkpoint",
                                                          "grow_after": [<layer indices>],
                                                          "grow_heads": <extra attention heads>,
                                                          "grow_heads_from": "fresh" | "split",
                                                          "grow_heads_lr": <the new heads' lr multiple>,
                                                          "grow_experts": <extra units per routed expert>,
                                                          "grow_shared_expert": <extra shared-expert units>,
                                                          "grow_experts_lr": <the new units' lr multiple>,
                                                          "grow_conv_kernel": <GDN short-conv taps>,
                                                          "grow_conv_lr": <the new taps' lr multiple>},
      "tokenizer": {"train": true, "vocab_size": 3000, "n_examples": 3000, "seed": 0,
                    "spacing": "own", "tasks": [...]} | {"path": "dir"},
      "data": {"source": "tasks", "tasks": ["airspace", "joint", "record"], "n_train": 20000,
               "seed": 0, "n_eval_per_task": 16, ...,
               "mine_pool": 0, "mine_share": 0.5, "mine_seed": 1},   # optional hard examples
      "train": {<TrainConfig fields: steps, batch_size, block_size, alpha, eps, lr, ...>},
      "generation": {<generation_config.json overrides, e.g. "presence_penalty": 0.0>}
    }

Unknown keys are errors (naming the key), so a typo never silently falls back to a default, and
every value is type-checked (pydantic, strict: `"lr": "fast"` or `"steps": "5"` is refused with
a one-line error naming the field). Scale-out keys in `train`: `strategy` ("ddp" | "fsdp"),
`activation_checkpointing` (bool); both optional.
With `model.init` the tokenizer defaults to the one saved in the init checkpoint.
"""

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic

from clover.data.tasks import TASKS, task_names

from .grow import HEAD_ORIGINS
from .trainer import TrainConfig

SOURCES = ("tasks", "digits")


@dataclass(frozen=True)
class ModelRecipe:
    config: dict[str, Any] = field(default_factory=dict)  # fresh model: CloverMoeConfig fields
    init: str | None = None  # or start from this Clover checkpoint
    preset: str | None = None  # or a built-in config (`clover info --preset`), `config` overriding it
    grow_after: tuple[int, ...] = ()  # with `init`: insert a residual-silent copy after these layers (grow.py)
    grow_heads: int = 0  # with `init`: this many residual-silent fresh heads per attention layer (grow.py)
    grow_heads_from: str = "fresh"  # or "split": the new heads copy old ones and share their writes
    grow_heads_lr: float = 1.0  # the new heads' learning rate, as a multiple of the run's
    grow_experts: int = 0  # with `init`: this many residual-silent fresh hidden units per routed expert
    grow_shared_expert: int = 0  # with `init`: and this many in each shared expert
    grow_experts_lr: float = 1.0  # the new units' learning rate, as a multiple of the run's
    grow_conv_kernel: int = 0  # with `init`: widen every GDN short conv to this many taps, the new ones zero
    grow_conv_lr: float = 1.0  # the new taps' learning rate, as a multiple of the run's

    def __post_init__(self):
        if not self.config and self.init is None and self.preset is None:
            raise ValueError("recipe.model needs `config` (a fresh model), `preset` or `init` (a checkpoint)")
        if self.grow_after and self.init is None:
            raise ValueError(f"recipe.model.grow_after={list(self.grow_after)} needs `init` (a trained model to grow)")
        if self.grow_heads and self.init is None:
            raise ValueError(f"recipe.model.grow_heads={self.grow_heads} needs `init` (a trained model to grow)")
        if self.grow_heads_from not in HEAD_ORIGINS:
            raise ValueError(f"recipe.model.grow_heads_from={self.grow_heads_from!r} must be one of {HEAD_ORIGINS}")
        if not self.grow_heads_lr > 0:
            raise ValueError(f"recipe.model.grow_heads_lr={self.grow_heads_lr} must be > 0")
        if self.grow_heads_lr != 1 and not self.grow_heads:
            raise ValueError(f"recipe.model.grow_heads_lr={self.grow_heads_lr} needs grow_heads (new heads to scale)")
        units = {"grow_experts": self.grow_experts, "grow_shared_expert": self.grow_shared_expert}
        for key, value in units.items():
            if value < 0:
                raise ValueError(f"recipe.model.{key}={value} must be >= 0 (extra hidden units)")
            if value and self.init is None:
                raise ValueError(f"recipe.model.{key}={value} needs `init` (a trained model to grow)")
        if self.grow_conv_kernel < 0:
            raise ValueError(f"recipe.model.grow_conv_kernel={self.grow_conv_kernel} must be >= 0 (0: unchanged)")
        if self.grow_conv_kernel and self.init is None:
            raise ValueError(f"recipe.model.grow_conv_kernel={self.grow_conv_kernel} needs `init` (a trained "
                             "model to grow)")
        if not self.grow_conv_lr > 0:
            raise ValueError(f"recipe.model.grow_conv_lr={self.grow_conv_lr} must be > 0")
        if self.grow_conv_lr != 1 and not self.grow_conv_kernel:
            raise ValueError(f"recipe.model.grow_conv_lr={self.grow_conv_lr} needs grow_conv_kernel "
                             "(new taps to scale)")
        if not self.grow_experts_lr > 0:
            raise ValueError(f"recipe.model.grow_experts_lr={self.grow_experts_lr} must be > 0")
        if self.grow_experts_lr != 1 and not any(units.values()):
            raise ValueError(f"recipe.model.grow_experts_lr={self.grow_experts_lr} needs grow_experts or "
                             "grow_shared_expert (new units to scale)")


@dataclass(frozen=True)
class TokenizerRecipe:
    path: str | None = None  # load this tokenizer folder
    train: bool = False  # or train a byte-level BPE on the task mixture
    vocab_size: int = 3000
    n_examples: int = 3000
    seed: int = 0
    spacing: str = "own"  # where a space between words goes (clover.data.tokenizer.SPACINGS)
    tasks: tuple[str, ...] = ()  # train on these tasks' texts (empty: the recipe's data.tasks)

    def __post_init__(self):
        from clover.data.tokenizer import SPACINGS

        if self.spacing not in SPACINGS:
            raise ValueError(f"recipe.tokenizer.spacing={self.spacing!r} must be one of {list(SPACINGS)}")
        unknown = sorted(set(self.tasks) - set(TASKS))
        if unknown:
            raise ValueError(f"recipe.tokenizer.tasks: unknown task(s) {unknown}; known: {sorted(TASKS)}")


@dataclass(frozen=True)
class DataRecipe:
    source: str = "tasks"  # "tasks" (clover.data) or "digits" (built-in copy/reverse, no tokenizer)
    tasks: tuple[str, ...] = ()  # empty: every registered task
    task_options: dict[str, dict] = field(default_factory=dict)
    task_weights: dict[str, int] = field(default_factory=dict)  # training share of a task (default 1 each)
    n_train: int = 20000  # training examples (visited in a new order each epoch)
    seed: int = 0
    n_eval_per_task: int = 16  # held-out examples per task (digits: in total)
    eval_batch_size: int = 16
    eval_generate: bool = True  # task accuracy via model.generate when the model has it
    eval_max_new_tokens: int = 256
    enable_thinking: bool = False
    thinking_fraction: float = 0.0  # this share of training examples (seeded) use the thinking turn
    max_prompt_len: int | None = None  # drop training/eval examples with longer prompts
    max_response_len: int | None = None  # ... or longer responses (EOS included, before block padding)
    group_by_length: bool = True  # batch examples of similar length together (less padding)
    digits: dict[str, Any] = field(default_factory=dict)  # DigitTask options (min_len, max_len, ops)
    # hard-example mining (clover.training.mining): `mine_pool` fresh examples drawn with
    # `mine_seed`, scored by the starting model; the `mine_share` of each task's with the largest
    # answer loss join the `n_train` examples
    mine_pool: int = 0
    mine_share: float = 0.5
    mine_seed: int | None = None

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"recipe.data.source={self.source!r} must be one of {SOURCES}")
        trained = task_names(self.tasks)
        bad = {name: w for name, w in self.task_weights.items() if w < 1 or name not in trained}
        if bad:
            raise ValueError(f"recipe.data.task_weights={bad}: each must be a positive integer for one of "
                             f"the trained tasks {list(trained)}")
        if not 0.0 <= self.thinking_fraction <= 1.0:
            raise ValueError(f"recipe.data.thinking_fraction={self.thinking_fraction} must be in [0, 1]")
        if self.mine_pool < 0:
            raise ValueError(f"recipe.data.mine_pool={self.mine_pool} must be >= 0")
        if self.mine_pool:
            if self.source != "tasks":
                raise ValueError(f"recipe.data.mine_pool needs source 'tasks', not {self.source!r}")
            if not 0.0 < self.mine_share <= 1.0:
                raise ValueError(f"recipe.data.mine_share={self.mine_share} must be in (0, 1]")
            if self.mine_seed is None or self.mine_seed == self.seed:
                raise ValueError(f"recipe.data.mine_seed={self.mine_seed} must be set and differ from "
                                 f"recipe.data.seed={self.seed} (the pool must be fresh examples)")


@dataclass(frozen=True)
class Recipe:
    model: ModelRecipe
    train: TrainConfig
    tokenizer: TokenizerRecipe = TokenizerRecipe()
    data: DataRecipe = DataRecipe()
    name: str = "clover"
    description: str = ""
    output_dir: str = "runs/clover"
    device: str = "cpu"
    num_threads: int | None = None  # torch intra-op threads (None: torch's default)
    export_dtype: str = "fp32"  # weights of the exported checkpoint: "fp32" or "bf16"
    # generation_config.json overrides of the export, also used by the task-accuracy eval
    generation: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.export_dtype not in ("fp32", "bf16"):
            raise ValueError(f"recipe.export_dtype={self.export_dtype!r} must be 'fp32' or 'bf16'")

    def with_overrides(self, init: str | None = None, output_dir: str | None = None,
                       device: str | None = None) -> "Recipe":
        recipe = self if device is None else dataclasses.replace(self, device=device)
        if init is not None:
            recipe = dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, init=init))
        if output_dir is not None:
            recipe = dataclasses.replace(recipe, output_dir=output_dir)
        return recipe

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


SECTIONS = {"model": ModelRecipe, "train": TrainConfig, "tokenizer": TokenizerRecipe, "data": DataRecipe}


def _check_keys(cls, data: Any, where: str) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"recipe.{where} must be a mapping, got {type(data).__name__}")
    allowed = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ValueError(f"recipe.{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _one_line(error: pydantic.ValidationError) -> str:
    """The first problem, naming the field: `recipe.train.lr: Input should be a valid number (got 'fast')`."""
    first = error.errors()[0]
    where = ".".join(["recipe", *map(str, first["loc"])])
    if first["type"] == "value_error":  # raised by a section's own check; it names the value
        return f"{where}: {first['msg'].removeprefix('Value error, ')}"
    if first["type"] == "missing":
        return f"{where}: required"
    return f"{where}: {first['msg']} (got {first['input']!r})"


def recipe_from_dict(data: Any) -> Recipe:
    _check_keys(Recipe, data, "<top level>")
    for required in ("model", "train"):
        if required not in data:
            raise ValueError(f"recipe needs a `{required}` section")
    for key, cls in SECTIONS.items():
        if key in data:
            _check_keys(cls, data[key], key)
    try:  # strict JSON-mode validation: arrays may fill tuples, ints floats; nothing else coerces
        return pydantic.TypeAdapter(Recipe).validate_json(json.dumps(data, default=str), strict=True)
    except pydantic.ValidationError as e:
        raise ValueError(_one_line(e)) from None


def load_recipe(path: str | Path) -> Recipe:
    """Read a recipe from `.json`, `.yaml` or `.yml`."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ValueError(f"{path}: YAML syntax error{at}: {getattr(e, 'problem', None) or e}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: JSON syntax error at line {e.lineno}, column {e.colno}: {e.msg}") from None
    return recipe_from_dict(data)


def save_recipe(recipe: Recipe, path: str | Path) -> None:
    Path(path).write_text(json.dumps(recipe.to_dict(), indent=2) + "\n", encoding="utf-8")
