"""Shared fixtures, on the embedded digits default, with few threads. Tests about one device say so
(``device="cpu"``); the others run on whatever ``--device auto`` picks."""
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


def model_state(model: torch.nn.Module) -> tuple:
    """What a caller holds of a model object: device of every tensor, train/eval mode of every
    module, requires_grad of every parameter (no public function may change any of it)."""
    return ([(n, str(t.device)) for n, t in list(model.named_parameters()) + list(model.named_buffers())],
            [(n, m.training) for n, m in model.named_modules()],
            [(n, p.requires_grad) for n, p in model.named_parameters()])


@pytest.fixture(autouse=True)
def _shared_models_untouched(request):
    """The session-wide model fixtures are shared by every test: fail the test that moves, re-modes
    or unfreezes one (foolbox once moved one to the GPU in place and broke later tests)."""
    used = [n for n in ("deit_model", "pid_model") if n in request.fixturenames]
    before = {n: model_state(request.getfixturevalue(n)) for n in used}
    yield
    for n in used:
        assert model_state(request.getfixturevalue(n)) == before[n], f"this test changed the shared {n} fixture"


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # subprocesses run with OMP_NUM_THREADS=1: same kernels, same floats
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def digits8():
    """scikit-learn's 8x8 digits as (N, 1, 8, 8) images in [0, 1] and labels: the tiny models' data."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return torch.tensor(d.images / 16.0, dtype=torch.float32)[:, None], torch.tensor(d.target)


@pytest.fixture(scope="session")
def plain(digits8):
    """A small MLP on the 8x8 digits (trained in a second): the convergence ladder's test model. Tests that wrap it
    deep-copy it first."""
    x, y = digits8
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(150):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x[200:]), y[200:]).backward()
        opt.step()
    return net.eval()


# The shipped checkpoints are the project's ground truth: the whole session must leave them byte for byte as it
# found them (a test or script that writes into checkpoints/ by accident fails the run here, on the controller
# once every worker is done).
_SHIPPED: dict = {}


def _shipped_hashes() -> dict:
    import hashlib

    from robustbench_pid.hub.checkpoints import checkpoints_dir

    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(checkpoints_dir().iterdir())
            if p.is_file() and not p.name.endswith(".lock")}


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):
        _SHIPPED.update(_shipped_hashes())


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput") or not _SHIPPED:
        return
    now = _shipped_hashes()
    changed = sorted(n for n in set(_SHIPPED) | set(now) if _SHIPPED.get(n) != now.get(n))
    if changed:
        import sys

        print(f"\nerror: the test session changed the shipped checkpoints ({', '.join(changed)}): a test wrote into "
              f"checkpoints/; restore them with `git checkout -- checkpoints/`", file=sys.stderr)
        session.exitstatus = 1
