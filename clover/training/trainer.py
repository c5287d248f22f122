"""The training loop: AdamW + warm-up/cosine, clipping, bf16, evaluation, exact resume, and the
scale-out strategies (DDP replicas or FSDP2 shards, activation checkpointing).

Contract: the trainer owns the optimizer, the scheduler and the run directory; the caller owns
the model (already on its device; the trainer shards it in place under FSDP) and the dataset.
Step `s` always trains on global batch `s`, each example's noise seeded by (seed, s, its position
in the global batch), and the loss is normalized by the global number of targets: the objective
of a step does not depend on the world size, a run resumed from a checkpoint continues exactly
as the uninterrupted run would have, and a checkpoint resumes at another world size.
Only rank 0 writes files; checkpoints are collective (every rank writes its shards).
"""

import json
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from . import checkpointing as ckpt
from .data import PairDataset
from .activation_checkpointing import checkpoint_layers
from .copy_attention import COPY_TARGETS, FACT_TARGETS, KEY_TARGETS, FactTokens, KeyTokens
from .line_owner import OWNER_READOUTS, OWNER_TARGETS, OwnerTerms
from .distributed import DistInfo, all_reduce_sum, barrier, broadcast_flag
from .loss import JointLoss
from .noising import LEVEL_UNITS, noise_generator, sample_example_noise, step_level_bounds
from .optim import build_optimizer, build_scheduler, scaled_updates
from .sharding import STRATEGIES, clip_gradients, distribute, shard_fsdp, sync_replicated_grads

EvalFn = Callable[[torch.nn.Module, int], dict[str, float]]
DTYPES = ("fp32", "bf16")


@dataclass(frozen=True)
class TrainConfig:
    steps: int  # total optimizer steps; the LR schedule spans them
    batch_size: int  # global batch (examples per step, over all ranks)
    block_size: int
    alpha: float = 1.0  # weight of L_diff
    eps: float = 1e-3  # lower bound of the per-block noise level
    max_level: float = 1.0  # upper bound of the per-block noise level (held-out loss keeps U(eps, 1))
    max_level_share: float = 1.0  # share of blocks (or steps) that max_level bounds; the rest U(eps, 1)
    max_level_per: str = "block"  # "block": the share drawn block by block; "step": whole steps, spread evenly
    suffix_mask: float = 0.0  # share of blocks masked from a random position to their end (noising.py)
    copy_attention: float = 0.0  # weight of the copy supervision's loss (copy_attention.py); 0: off
    copy_heads: tuple[tuple[int, int], ...] = ()  # (full-attention layer, head) it trains; empty: any
    copy_targets: str = "tokens"  # a copied token's source, or one of KEY_TARGETS (copy_attention.py)
    copy_value: float = 0.0  # weight of the loss that copy_heads write the sourced token (copy_attention.py)
    fact_copy: float = 0.0  # weight of joint's fact-line copy supervision (copy_attention.py); 0: off
    fact_copy_heads: tuple[tuple[int, int], ...] = ()  # (full-attention layer, head) it trains; needed
    fact_copy_value: float = 0.0  # weight of the loss that fact_copy_heads write the sourced token
    fact_copy_targets: str = "lines"  # "lines": a copy's tokens after the name; "first_words": its first property
    owner_loss: float = 0.0  # weight of the line-owner supervision's loss (line_owner.py); 0: off
    owner_layer: int = 0  # the decoder layer whose output it reads
    owner_readout: str = "embedding"  # how it reads the pilot there: "embedding" or "ridge" (line_owner.py)
    owner_target: str | tuple[str, ...] = "pilot"  # of OWNER_TARGETS (line_owner.py); several: a loss each
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 0
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    dtype: str = "fp32"  # "fp32", or "bf16" autocast over fp32 master weights
    seed: int = 0
    use_coreset: bool | None = None  # block-mode coreset in training (None: the model config's)
    eval_interval: int = 0  # 0: evaluate only at the end
    save_interval: int = 0  # 0: checkpoint only when stopping
    log_interval: int = 10  # train.log line every N steps (metrics.jsonl gets every step)
    keep_checkpoints: int = 2
    strategy: str = "ddp"  # under torchrun: "ddp" (replicas) or "fsdp" (FSDP2 shards per layer)
    activation_checkpointing: bool = False  # recompute each decoder layer in the backward pass

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} must be one of {DTYPES}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy={self.strategy!r} must be one of {STRATEGIES}")
        for name in ("steps", "batch_size", "block_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be positive")
        if not self.eps < self.max_level <= 1.0:
            raise ValueError(f"max_level={self.max_level} must be in (eps={self.eps}, 1]")
        if not 0.0 <= self.max_level_share <= 1.0:
            raise ValueError(f"max_level_share={self.max_level_share} must be in [0, 1]")
        if self.max_level_per not in LEVEL_UNITS:
            raise ValueError(f"max_level_per={self.max_level_per!r} must be one of {LEVEL_UNITS}")
        if not 0.0 <= self.suffix_mask <= 1.0:
            raise ValueError(f"suffix_mask={self.suffix_mask} must be in [0, 1]")
        if self.copy_attention < 0:
            raise ValueError(f"copy_attention={self.copy_attention} must be >= 0")
        if self.copy_value < 0 or (self.copy_value and not (self.copy_attention and self.copy_heads)):
            raise ValueError(f"copy_value={self.copy_value} must be >= 0, and > 0 only with copy_attention and "
                             f"copy_heads (copy_attention={self.copy_attention}, copy_heads={self.copy_heads})")
        if self.fact_copy < 0 or (self.fact_copy and not self.fact_copy_heads):
            raise ValueError(f"fact_copy={self.fact_copy} must be >= 0, and > 0 only with fact_copy_heads "
                             f"(fact_copy_heads={self.fact_copy_heads})")
        if self.fact_copy_value < 0 or (self.fact_copy_value and not self.fact_copy):
            raise ValueError(f"fact_copy_value={self.fact_copy_value} must be >= 0, and > 0 only with fact_copy "
                             f"(fact_copy={self.fact_copy})")
        if self.fact_copy_targets not in FACT_TARGETS:
            raise ValueError(f"fact_copy_targets={self.fact_copy_targets!r} must be one of {FACT_TARGETS}")
        if self.copy_targets not in COPY_TARGETS:
            raise ValueError(f"copy_targets={self.copy_targets!r} must be one of {COPY_TARGETS}")
        if self.owner_loss < 0:
            raise ValueError(f"owner_loss={self.owner_loss} must be >= 0")
        if self.owner_readout not in OWNER_READOUTS:
            raise ValueError(f"owner_readout={self.owner_readout!r} must be one of {OWNER_READOUTS}")
        targets = self.owner_targets
        if not targets or len(set(targets)) < len(targets) or not set(targets) <= set(OWNER_TARGETS):
            raise ValueError(f"owner_target={self.owner_target!r} must be one of {OWNER_TARGETS}, or several of "
                             "them, each once")

    @property
    def owner_targets(self) -> tuple[str, ...]:
        """`owner_target` as a tuple: the owner terms, each at `owner_layer` and weight `owner_loss`."""
        return (self.owner_target,) if isinstance(self.owner_target, str) else tuple(self.owner_target)


@dataclass(frozen=True)
class StepStats:
    step: int  # steps done after this one
    loss: float  # means over ranks
    l_ar: float
    l_diff: float
    lr: float
    grad_norm: float
    tokens: int  # clean-sequence tokens over all ranks
    targets: int
    seconds: float
    l_copy: float = 0.0  # the copy supervision's loss (0 when off)
    l_owner: float = 0.0  # the line-owner supervision's loss (0 when off)
    l_value: float = 0.0  # the copy heads' written-token loss (0 when off)
    l_fact: float = 0.0  # the fact-line copy supervision's loss (0 when off)
    l_fact_value: float = 0.0  # the fact heads' written-token loss (0 when off)


AUX_LOSSES = ("l_copy", "l_owner", "l_value", "l_fact", "l_fact_value")  # StepStats' optional losses


@dataclass(frozen=True)
class TrainSummary:
    step: int
    reason: str  # "done", "max_steps" or "max_minutes"
    last: StepStats | None
    tokens: int  # tokens trained on in this invocation (all ranks)
    seconds: float  # wall time of those steps
    checkpoint: Path | None

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


class Trainer:
    def __init__(self, model: torch.nn.Module, config: TrainConfig, dataset: PairDataset,
                 run_dir: str | Path | None = None, eval_fn: EvalFn | None = None,
                 dist: DistInfo = DistInfo(), progress: bool = True,
                 update_scales: dict[str, torch.Tensor] | None = None, key_tokens: KeyTokens | None = None,
                 owner_tokens: OwnerTerms | None = None, fact_tokens: FactTokens | None = None):
        """`update_scales`: parameter name -> per-element multiplier of its updates (optim.py);
        `key_tokens`: the keyed copies' token ids, which copy supervision needs with `copy_targets` one
        of KEY_TARGETS;
        `owner_tokens`: the token ids of what line-owner supervision asks for (line_owner.TargetTokens),
        or a tuple of them, one per `owner_targets`, which it needs; `fact_tokens`: those of joint's
        fact-line copies, which `fact_copy` needs."""
        self.model, self.config, self.dataset, self.dist = model, config, dataset, dist
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.eval_fn, self.progress = eval_fn, progress
        self.device = next(model.parameters()).device
        params = dict(model.named_parameters())  # before any wrapper renames them
        self.update_scales = {params[name]: scale.to(self.device) for name, scale in (update_scales or {}).items()}
        if config.activation_checkpointing:
            checkpoint_layers(model)
        self.sharded = config.strategy == "fsdp" and dist.enabled
        if update_scales and self.sharded:
            raise ValueError("per-element update scales need whole parameters: use strategy 'ddp', not 'fsdp'")
        if config.owner_loss and self.sharded:
            raise ValueError("line-owner supervision reads whole name embeddings: use strategy 'ddp', not 'fsdp'")
        self.replicated = shard_fsdp(model, config.dtype) if self.sharded else []
        keyed = config.copy_targets in KEY_TARGETS
        if config.copy_attention and keyed and key_tokens is None:
            raise ValueError(f"copy_targets={config.copy_targets!r} needs the keyed copies' token ids (key_tokens)")
        keys = key_tokens if keyed else None
        loss = JointLoss(model, config.block_size, config.alpha, config.use_coreset, config.copy_attention,
                         config.copy_heads, keys, config.owner_loss, config.owner_layer, owner_tokens,
                         config.owner_readout, config.copy_value, config.fact_copy, config.fact_copy_heads,
                         fact_tokens, config.fact_copy_value)
        self.engine = distribute(loss, model, config.strategy, dist)
        self.optimizer = build_optimizer(model, config.lr, config.weight_decay, config.betas)
        self.scheduler = build_scheduler(self.optimizer, config.warmup_steps, config.steps,
                                         config.min_lr_ratio)
        self.step = 0
        self.tokens_seen = 0
        if self.run_dir is not None and dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)

    # -- one step -------------------------------------------------------------------------------

    def _autocast(self):
        if self.config.dtype == "bf16" and not self.sharded:  # FSDP casts through its policy
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def train_step(self) -> StepStats:
        cfg, rank = self.config, self.dist.rank
        start = time.perf_counter()
        world = self.dist.world_size
        batch = self.dataset.batch(self.step, rank, world)
        positions = self.dataset.rank_slice(rank, world)  # this rank's rows in the global batch
        max_level, share = step_level_bounds(self.step, cfg.max_level, cfg.max_level_share, cfg.max_level_per)
        noise = sample_example_noise(batch.target_mask, cfg.block_size, cfg.eps,
                                     [noise_generator(cfg.seed, self.step, i) for i in positions],
                                     cfg.suffix_mask, max_level, share)
        global_targets, = all_reduce_sum([batch.num_targets], self.dist)
        batch, noise = batch.to(self.device), noise.to(self.device)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        with self._autocast():
            # ranks' gradients are averaged: normalize by the per-rank share of all targets
            result = self.engine(batch, noise, global_targets / world)
        result.total.backward()
        sync_replicated_grads(self.replicated, self.dist)
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        grad_norm = clip_gradients(params, max_norm)
        lr = self.scheduler.get_last_lr()[0]
        with scaled_updates(self.update_scales):
            self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        aux = [0.0 if (value := getattr(result, name)) is None else value.item() for name in AUX_LOSSES]
        loss, l_ar, l_diff, tokens, *aux = all_reduce_sum(
            [result.total.item(), result.l_ar.item(), result.l_diff.item(), batch.num_tokens, *aux], self.dist)
        self.tokens_seen += int(tokens)
        return StepStats(self.step, loss / world, l_ar / world, l_diff / world, lr, grad_norm,
                         int(tokens), int(global_targets), time.perf_counter() - start,
                         **{name: value / world for name, value in zip(AUX_LOSSES, aux)})

    # -- the loop -------------------------------------------------------------------------------

    def train(self, max_steps: int | None = None, max_minutes: float | None = None) -> TrainSummary:
        """Train until `config.steps`, or `max_steps` more steps, or `max_minutes` of wall time;
        then checkpoint (when there is a run dir) and evaluate."""
        cfg = self.config
        stop_at = cfg.steps if max_steps is None else min(cfg.steps, self.step + max_steps)
        deadline = None if max_minutes is None else time.monotonic() + 60.0 * max_minutes
        bar = tqdm(total=cfg.steps, initial=self.step, disable=not (self.progress and self.dist.is_main),
                   dynamic_ncols=True, desc="train")
        self.log(f"start step={self.step} stop_at={stop_at} world={self.dist.world_size}")
        tokens = seconds = 0
        first = self.step
        last, reason = None, "done"
        while self.step < stop_at:
            last = self.train_step()
            tokens, seconds = tokens + last.tokens, seconds + last.seconds
            bar.update(1)
            rate = tokens / seconds
            eta = seconds / (self.step - first) * (stop_at - self.step)
            bar.set_postfix(loss=f"{last.loss:.3f}", ar=f"{last.l_ar:.3f}", diff=f"{last.l_diff:.3f}",
                            tok_s=f"{rate:.0f}")
            metrics = {**asdict(last), "tokens_per_second": rate, "eta_seconds": eta}
            self._log_metrics(metrics, text=bool(cfg.log_interval) and (
                self.step % cfg.log_interval == 0 or self.step == stop_at))
            if cfg.save_interval and self.step % cfg.save_interval == 0 and self.step < stop_at:
                self.save()
            if cfg.eval_interval and self.step % cfg.eval_interval == 0 and self.step < stop_at:
                self.evaluate()
            out_of_time = deadline is not None and time.monotonic() > deadline
            if self.step < stop_at and broadcast_flag(out_of_time, self.dist):
                reason = "max_minutes"
                break
        bar.close()
        if reason == "done" and self.step < cfg.steps:
            reason = "max_steps"
        path = self.save() if self.run_dir is not None else None
        self.evaluate()
        summary = TrainSummary(self.step, reason, last, tokens, seconds, path)
        self.log(f"stop step={self.step} reason={reason} tokens={tokens} "
                 f"tokens_per_second={summary.tokens_per_second:.1f}")
        return summary

    def evaluate(self) -> dict[str, float]:
        """Run the eval callback on rank 0 (no grad, eval mode) and log its metrics. A sharded
        model needs every rank in each forward, so under FSDP every rank runs it (identically)."""
        metrics: dict[str, float] = {}
        if self.eval_fn is not None and (self.dist.is_main or self.sharded):
            self.model.eval()
            with torch.no_grad(), self._autocast():
                metrics = self.eval_fn(self.model, self.step)
            self.model.train()
            self._log_metrics({"step": self.step, **{f"eval/{k}": v for k, v in metrics.items()}}, text=True)
        barrier(self.dist)
        return metrics

    # -- checkpoints ----------------------------------------------------------------------------

    def meta(self) -> dict:
        """What a checkpoint holds besides tensors (JSON: counters, config, scheduler, RNG)."""
        return {"step": self.step, "data_position": self.step * self.dataset.batch_size,
                "tokens_seen": self.tokens_seen, "config": asdict(self.config),
                "scheduler": self.scheduler.state_dict(), "rng": ckpt.capture_rng()}

    def save(self) -> Path | None:
        """Checkpoint the run (collective: every rank writes its shards, rank 0 the rest)."""
        if self.run_dir is None:
            return None
        path = ckpt.save_checkpoint(self.run_dir, self.step, self.model, self.optimizer, self.meta(),
                                    self.dist, self.config.keep_checkpoints)
        self.log(f"checkpoint {path}")
        return path

    def resume(self, path: str | Path | None = None) -> bool:
        """Load `path` or the run dir's latest checkpoint (written at any world size); False
        when there is none. Old pickled `step-N.pt` files are never opened."""
        if path is None and self.run_dir is not None:
            for legacy in ckpt.legacy_checkpoints(self.run_dir):
                self.warn(f"ignoring {legacy}: pickled checkpoints of older versions are not loaded")
            path = ckpt.latest_checkpoint(self.run_dir)
        if path is None:
            return False
        state = ckpt.load_checkpoint(path, self.model, self.optimizer, self.dist)
        changed = sorted(k for k, v in asdict(self.config).items()
                         if _jsonable(state["config"].get(k)) != _jsonable(v))
        if changed:  # allowed (e.g. a longer run), but the resumed run is then a different run
            diffs = [f"{k} ({state['config'].get(k)!r} -> {getattr(self.config, k)!r})" for k in changed]
            self.warn("config differs from the checkpoint's in " + ", ".join(diffs))
        self.scheduler.load_state_dict(state["scheduler"])
        ckpt.restore_rng(state["rng"])
        self.step, self.tokens_seen = state["step"], state["tokens_seen"]
        self.log(f"resumed from {path} at step {self.step} (saved by {state['world_size']} rank(s), "
                 f"now {self.dist.world_size})")
        return True

    # -- logs -----------------------------------------------------------------------------------

    def log(self, message: str) -> None:
        log_line(self.run_dir, self.dist, message)

    def warn(self, message: str) -> None:
        """A warning in train.log and on stderr (rank 0)."""
        log_line(self.run_dir, self.dist, f"warning: {message}", echo=True)

    def _log_metrics(self, metrics: dict, text: bool = False) -> None:
        """One JSON line in metrics.jsonl; also in train.log when `text`."""
        if self.dist.is_main and self.run_dir is not None:
            line = json.dumps(metrics, default=float)
            with open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(line + "\n")
            if text:
                self.log(line)


def log_line(run_dir: Path | None, dist: DistInfo, message: str, echo: bool = False) -> None:
    """One timestamped line in `run_dir/train.log` (rank 0); also on stderr when `echo`."""
    if not dist.is_main:
        return
    if run_dir is not None:
        with open(Path(run_dir) / "train.log", "a", encoding="utf-8") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n")
    if echo:
        print(message, file=sys.stderr, flush=True)


def _jsonable(value):
    """Tuples read back from JSON as lists."""
    return list(value) if isinstance(value, tuple) else value
