"""Specs: what to evaluate. Data flows one way: spec -> model + data -> runner -> records -> tables."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

PROTOCOLS = ("standard", "paper")
PRECISIONS = ("fp32", "bf16", "fp16")  # of the attack's forward/backward passes (verdicts are always fp32)
DECODES = ("cpu", "gpu")  # --decode: PIL in the loader workers, or JPEG bytes decoded on the GPU (data/batch_decode.py)
ANALYSES = ("attention",)  # --analyze: probes run on the attack's final points (robustbench_pid/probes/)
# spec keys that do not change what a run computes (where, how fast, how it is shown): neither the run folder's
# default name nor the one-configuration check depends on them, so a run resumes on another device or compiled
RUNTIME_KEYS = ("out", "quiet", "num_workers", "shard", "dry_run", "calibration", "device", "compile")
# spec keys left out of ``as_dict`` at this value, so the folders of runs made before the key existed keep their names
OMITTED_AT = {"decode": "cpu"}


@dataclass(frozen=True)
class Unit:
    """A piece of work whose records depend only on what its key hashes."""

    benchmark: str
    attack: str  # "clean", an attack name, or a benchmark-specific condition family
    eps: float
    params: str  # canonical JSON of the settings
    condition: str  # benchmark-specific (e.g. "gaussian_noise/3"); "" for attacks
    start: int  # sample positions [start, stop) within the evaluated set
    stop: int
    key: str = ""


def chunks(n: int, size: int) -> List[Tuple[int, int]]:
    """Sample ranges [start, stop) of ``size`` (the last one shorter) covering ``n`` samples."""
    return [(s, min(n, s + size)) for s in range(0, n, size)]


@dataclass(frozen=True)
class AttackSpec:
    """One attack at one setting (eps included in ``params``)."""

    attack: str
    params: Dict[str, Any] = field(default_factory=dict)


@dataclass
class RunSpec:
    model: str
    checkpoint: Optional[str] = None
    checkpoint_dir: Optional[str] = None  # where registry names are looked for first (released.py)
    dataset: str = "digits"
    split: str = "test"
    data_root: Optional[str] = None
    protocol: str = "standard"
    attacks: List[AttackSpec] = field(default_factory=list)
    benchmark: str = "adversarial"
    benchmark_options: Dict[str, Any] = field(default_factory=dict)
    suite: Optional[str] = None
    limit: Optional[int] = None
    subset: Optional[int] = None  # a fixed, seeded subset of this many samples (dataset-defined)
    skip_unreadable: bool = False  # skip (and count) unreadable images instead of failing
    dry_run: bool = False
    # --dry-run only: (forward, forward+backward) images/s of the device the plan is priced for,
    # instead of a calibration batch measured here (planning a GPU run from a laptop)
    calibration: Optional[Tuple[float, float]] = None
    batch_size: int = 128
    chunk_size: int = 512
    seed: int = 0
    device: str = "auto"
    precision: str = "fp32"
    compile: bool = False
    num_workers: int = 0
    out: Optional[Path] = None
    allow_pickle: bool = False
    strict: bool = True
    shard: Optional[str] = None  # "i/n"
    quiet: bool = False
    arch_kwargs: Dict[str, Any] = field(default_factory=dict)
    analyze: List[str] = field(default_factory=list)  # ANALYSES names; part of every unit key when set
    # evidence that each attack worked (docs/attacks.md): indicators of attack failure (adds the
    # unconstrained runs), per-iteration losses to trace.parquet, fp32 re-runs of N samples
    indicators: bool = False
    trace: bool = False
    agreement: int = 0
    # --converge: the convergence ladder's settings (benchmarks/ladder/spec.py LadderSpec); None: off
    converge: Optional[Dict[str, Any]] = None
    # --save-adv: every attack unit keeps its adversarial images (results/files/adversarial.py); in unit keys
    save_adv: bool = False
    # --decode: "cpu" (PIL in the loader workers) or "gpu" (data/batch_decode.py); another decoder gives other
    # pixels, so it is in the spec (not a runtime key) and in every unit key when not "cpu"
    decode: str = "cpu"

    def as_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["out"] = str(self.out) if self.out else None
        for key in ("analyze", "indicators", "trace", "agreement", "converge", "save_adv"):
            if not d[key] and not (key == "converge" and d[key] is not None):
                del d[key]  # options left off: folders of runs without them keep their names
        for key, default in OMITTED_AT.items():
            if d.get(key) == default:
                del d[key]
        return d
