"""How this process was launched: the one place that reads the launchers' environment.

Sharding rides on existing launchers, with no collectives: ``--shard i/n`` (any scheduler),
torchrun (``RANK``/``WORLD_SIZE``, ``LOCAL_RANK`` for the GPU), a Slurm array
(``SLURM_ARRAY_TASK_ID``/``_COUNT``/``_MIN``; ``SLURM_LOCALID`` picks a GPU for ``srun`` tasks that
share a node's GPUs), or a single process. A shard takes every n-th unit of the plan; shards share
nothing but the run folder. Everything else (runner, device choice, the CLI) asks :func:`launch`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ..errors import UserError

SINGLE, SHARD, TORCHRUN, SLURM = "single", "shard", "torchrun", "slurm-array"


@dataclass(frozen=True)
class Launch:
    kind: str  # SINGLE, SHARD (--shard i/n), TORCHRUN or SLURM
    index: int  # this process's shard
    count: int  # how many shards
    local_rank: Optional[int] = None  # torchrun's LOCAL_RANK: this process's GPU on its node

    @property
    def is_torchrun(self) -> bool:
        """torchrun with several ranks: rank 0 waits for the others and writes the tables (torchrun
        stops every rank when one fails, so waiting cannot hang on a dead rank for long)."""
        return self.kind == TORCHRUN and self.count > 1

    @property
    def leads_node(self) -> bool:
        """The process that speaks for its node (progress bar, dry-run plan): local rank 0."""
        return self.local_rank in (None, 0)


def launch(shard: Optional[str] = None) -> Launch:
    """This process's shard from ``--shard i/n``, else torchrun, else a Slurm array, else (0, 1)."""
    env = os.environ
    local = int(env["LOCAL_RANK"]) if "LOCAL_RANK" in env else None
    if shard:
        try:
            i, n = (int(t) for t in str(shard).split("/"))
        except ValueError:
            raise UserError(f"--shard must look like i/n (e.g. 0/4), got {shard!r}") from None
        if not (n >= 1 and 0 <= i < n):
            raise UserError(f"--shard {shard}: need 0 <= i < n")
        return Launch(SHARD, i, n, local)
    if "WORLD_SIZE" in env and "RANK" in env:
        kind, i, n = TORCHRUN, int(env["RANK"]), int(env["WORLD_SIZE"])
        where = "torchrun RANK/WORLD_SIZE"
    elif "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_TASK_COUNT" in env:
        lo = int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
        kind, i, n = SLURM, int(env["SLURM_ARRAY_TASK_ID"]) - lo, int(env["SLURM_ARRAY_TASK_COUNT"])
        where = "Slurm array (SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN, SLURM_ARRAY_TASK_COUNT)"
    else:
        return Launch(SINGLE, 0, 1, local)
    if not (n >= 1 and 0 <= i < n):
        raise UserError(f"{where} gives shard {i} of {n}; array ids must be contiguous (e.g. --array=0-7), "
                        f"or pass --shard i/n explicitly")
    return Launch(kind, i, n, local)


def local_gpu(count: int) -> Optional[int]:
    """The GPU index the launcher gives this process among ``count`` visible ones: LOCAL_RANK
    (torchrun), else SLURM_LOCALID when this task sees several GPUs; None: the current one."""
    local = os.environ.get("LOCAL_RANK")
    if local is not None:
        return int(local)
    slurm_local = os.environ.get("SLURM_LOCALID")
    if slurm_local is not None and count > 1 and int(slurm_local) < count:
        return int(slurm_local)
    return None
