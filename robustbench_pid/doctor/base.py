"""Doctor's vocabulary: a check's outcome, its row, and the settings every check reads."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

VERDICTS = ("PASS", "WARN", "FAIL", "SKIP")  # SKIP: not run in --quick (the row says why)
Outcome = Tuple[str, str, Dict[str, Any]]  # (verdict, one line, figures for --json)


@dataclass
class Check:
    section: str
    name: str
    verdict: str
    line: str
    seconds: float
    data: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Settings:
    """What the checks run on; tests shrink or replace parts (``model_factory``, ``memory_bytes``)."""

    device: Any  # torch.device
    quick: bool
    tmp: Path
    smoke_models: Tuple[str, ...] = ("pid_deit", "deit")
    smoke_n: int = 64
    smoke_steps: int = 5
    smoke_eps: str = "8/255"
    speed_batch: int = 8
    reps: int = 3
    pgd_steps: int = 5
    tree_images: int = 64
    compile_timeout_s: float = 120.0
    memory_bytes: Optional[int] = None  # largest batch on CPU: host memory unless given
    model_factory: Optional[Callable[[str], Any]] = None  # embedded model by name (default: rbp.load_model)

    @classmethod
    def for_device(cls, device: Any, quick: bool, tmp: Path) -> "Settings":
        """Sizes per mode, budgeted so that --quick takes about a minute on a 2-core CPU and the full
        run under ten minutes on one GPU (CPU: as long as it takes; the speed rows dominate)."""
        cuda = device.type == "cuda"
        if quick:
            return cls(device, True, tmp, smoke_n=32, smoke_steps=3, speed_batch=2, reps=3, pgd_steps=2,
                       tree_images=8, compile_timeout_s=60.0)
        if cuda:
            return cls(device, False, tmp, smoke_n=360, smoke_steps=10, speed_batch=256, reps=5, pgd_steps=10,
                       tree_images=1024, compile_timeout_s=120.0)
        return cls(device, False, tmp, smoke_n=64, smoke_steps=5, speed_batch=8, reps=3, pgd_steps=5,
                   tree_images=64, compile_timeout_s=300.0)


