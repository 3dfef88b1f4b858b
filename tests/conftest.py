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
