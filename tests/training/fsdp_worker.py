"""Run by `torch.distributed.run` (2 ranks, gloo) in test_fsdp: FSDP training of the digits model,
with and without activation checkpointing, with a checkpoint at step 3 and a resume from it,
and a resume from a single-process checkpoint. Rank 0 saves what the test compares to OUT/fsdp.pt."""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from clover.training.distributed import init_distributed, shutdown
from clover.training.sharding import full_state_dict, local_state_bytes
from clover.training.trainer import Trainer
from tests.training.fsdp_common import STEPS, config, dataset, model

out = Path(sys.argv[1])
torch.set_num_threads(1)
info = init_distributed("cpu")


def full_optimizer(trainer):
    """The whole optimizer state, copied: the tensors FSDP left whole (AdamW step counts, the
    0-dim parameters' moments) come back as the live ones, which the next steps would change."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
    from torch.utils._pytree import tree_map_only

    state = get_optimizer_state_dict(trainer.model, trainer.optimizer,
                                     options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return tree_map_only(torch.Tensor, torch.Tensor.clone, state)


results = {}
for ac in (False, True):  # straight FSDP runs, the first one checkpointing at step 3
    run = out / "fsdp-run" if not ac else None
    trainer = Trainer(model(), config(strategy="fsdp", activation_checkpointing=ac), dataset(), run,
                      dist=info, progress=False)
    losses = [trainer.train_step().loss for _ in range(3)]
    if run:
        trainer.save()
    losses += [trainer.train_step().loss for _ in range(STEPS - 3)]
    results[f"ac={ac}"] = {"losses": losses, "params": full_state_dict(trainer.model)}
    if not ac:
        results["bytes"] = local_state_bytes(trainer.model, trainer.optimizer)

for name, source in (("resume2", out / "fsdp-run"), ("resume1to2", out / "single-run")):
    trainer = Trainer(model(seed=9), config(strategy="fsdp"), dataset(), source, dist=info, progress=False)
    assert trainer.resume() and trainer.step == 3
    loaded = {"params": full_state_dict(trainer.model), "optim": full_optimizer(trainer),
              "lr": trainer.scheduler.get_last_lr()}
    losses = [trainer.train_step().loss for _ in range(STEPS - 3)]
    results[name] = {"loaded": loaded, "losses": losses, "params": full_state_dict(trainer.model)}

if info.rank == 0:
    torch.save(results, out / "fsdp.pt")
dist.barrier()
shutdown(info)
