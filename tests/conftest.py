"""Shared fixtures. Tests run on CPU, with few threads, on the embedded digits default."""
from __future__ import annotations

import pytest
import torch

# One thread: on a loaded or oversubscribed machine OpenMP threads spin (docs/performance.md).
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def digits_test():
    from robustbench_pid import load_dataset

    return load_dataset("digits", "test")


@pytest.fixture(scope="session")
def deit_model():
    from robustbench_pid import load_model

    return load_model("deit")


@pytest.fixture(scope="session")
def pid_model():
    from robustbench_pid import load_model

    return load_model("pid_deit")


@pytest.fixture(scope="session")
def digits_batch(digits_test):
    """The first 64 test images and labels."""
    x = digits_test.images[:64].clone()
    y = digits_test.labels[:64].clone()
    return x, y


def small_pgd_spec(out, limit: int, **kw):
    """A small sharded/resumable workload: PGD-5 at 2/255 and 4/255 on the first ``limit`` digits,
    in chunks of 10 (so there are many units to interrupt, shard and merge)."""
    from robustbench_pid.specs import AttackSpec, RunSpec

    attacks = [AttackSpec("pgd", {"eps": e / 255, "steps": 5, "step_size": None, "step_size_factor": None,
                                  "random_start": True, "early_stop": True, "stop_topk": 5}) for e in (2, 4)]
    return RunSpec(model="pid_deit", attacks=attacks, limit=limit, chunk_size=10, batch_size=16, out=out,
                   quiet=True, **kw)


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # subprocesses run with OMP_NUM_THREADS=1: same kernels, same floats
    yield
    torch.set_num_threads(n)
