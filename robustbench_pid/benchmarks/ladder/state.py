"""The per-sample state of one chunk's ladder: which samples are robust, which rung broke each, the passes each
rung spent, the worst-case point found, and the evidence the stop rule reads: the lowest verdict margin each kind of
family reached, which samples had each kind's full budget, and what each family keeps to continue from."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np
import pandas as pd
import torch

from ...results.summaries.stop_rule import share_left
from .families import BY_NAME
from .rungs import Rung, RungResult

KINDS = ("gradient", "free")  # whose evidence: the gradient families' (and EOT's, SPSA's), or the random search's


@dataclass
class Ladder:
    """The per-sample state of one chunk's ladder (see the module docstring)."""

    robust: torch.Tensor  # bool, top-1 correct under every rung so far (and clean)
    broken_by: List[str] = field(default_factory=list)  # rung id or "" per sample
    forward: Dict[str, torch.Tensor] = field(default_factory=dict)  # rung id -> forward images per sample
    backward: Dict[str, torch.Tensor] = field(default_factory=dict)
    history: List[Dict[str, Any]] = field(default_factory=list)  # per rung: id, attacked, broke, round, settings
    worst: Optional[torch.Tensor] = None  # per sample: the worst-case point (CPU)
    # per kind: per sample, the lowest verdict margin z_y - max z_j its rungs reached inside the ball (+inf: none)
    margin: Dict[str, torch.Tensor] = field(default_factory=dict)
    clean_margin: Optional[torch.Tensor] = None  # the verdict margin at the clean point (set by the benchmark)
    misleading: Optional[torch.Tensor] = None  # per sample: the gradient probe flagged it
    full: Dict[str, torch.Tensor] = field(default_factory=dict)  # per kind: the sample had that kind's full budget
    restarted: Optional[torch.Tensor] = None  # per sample: as an edge sample, it had its fresh starts
    kept: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # per family: what it continues from
    last_broke: Optional[torch.Tensor] = None  # per sample: broken by the last round that ran
    tau: float = 0.0  # the last round's tau (the stop rule's)
    rivals: bool = False  # Square came nearer than the gradient families on more samples than the tolerance
    status: str = ""
    detail: str = ""

    def __post_init__(self) -> None:
        n = len(self.robust)
        if not self.broken_by:
            self.broken_by = [""] * n
        if self.misleading is None:
            self.misleading = torch.zeros(n, dtype=torch.bool)
        if self.last_broke is None:
            self.last_broke = torch.zeros(n, dtype=torch.bool)
        if self.restarted is None:
            self.restarted = torch.zeros(n, dtype=torch.bool)
        for kind in KINDS:
            self.margin.setdefault(kind, torch.full((n,), float("inf")))
            self.full.setdefault(kind, torch.zeros(n, dtype=torch.bool))
        for name in BY_NAME:
            self.kept.setdefault(name, {})

    def charge(self, rung: str, idx: torch.Tensor, fwd: torch.Tensor, bwd: torch.Tensor) -> None:
        n = len(self.robust)
        for store, v in ((self.forward, fwd), (self.backward, bwd)):
            t = store.setdefault(rung, torch.zeros(n, dtype=torch.float64))
            t[idx.cpu()] += v.detach().double().cpu()

    def record(self, rung: Rung, idx: torch.Tensor, res: RungResult) -> int:
        """Apply a rung's verdicts (``res.still``: top-1 correct after it, per attacked sample) and evidence."""
        idx = idx.cpu()
        hit = ~res.still.cpu()
        broke = idx[hit]
        for i in broke.tolist():
            self.broken_by[i] = rung.id
        self.robust[broke] = False
        if self.worst is not None and res.x_adv is not None and len(broke):
            self.worst[broke] = res.x_adv[hit.to(res.x_adv.device)].detach().to(self.worst.device, self.worst.dtype)
        if res.margin_best is not None and len(idx):
            t = self.margin[rung.kind]
            t[idx] = torch.minimum(t[idx], res.margin_best.detach().float().cpu())
        if rung.family in BY_NAME:
            BY_NAME[rung.family].keep(self.kept[rung.family], rung, idx, res, len(self.robust))
        self.history.append({"id": rung.id, "attacked": int(len(idx)), "broke": int(len(broke)),
                             "full": rung.scope == "robust", "label": rung.attack, "round": rung.round,
                             "family": rung.family, "scope": rung.scope, "settings": rung.describe()})
        return int(len(broke))

    def left(self, kind: str) -> torch.Tensor:
        """Per sample, the share of its clean verdict margin that ``kind``'s searches left (inf: none reached, or no
        clean margin)."""
        m = self.margin[kind]
        if self.clean_margin is None:
            return torch.full_like(m, float("inf"))
        return torch.as_tensor(share_left(m.numpy(), self.clean_margin.float().numpy()), dtype=torch.float32)

    def evidence(self, no_grad: torch.Tensor, unstable: bool, batch_dependent: bool, edge: float) -> pd.DataFrame:
        """The stop rule's evidence table (``results/summaries/stop_rule.py``), one row per sample."""
        n = len(self.robust)
        broken = ~self.robust
        return pd.DataFrame({
            "robust": self.robust.numpy().copy(), "no_gradient": no_grad.cpu().numpy().astype(bool),
            "misleads": self.misleading.numpy().astype(bool), "left_gradient": self.left("gradient").numpy(),
            "left_free": self.left("free").numpy(), "full_gradient": (self.full["gradient"] | broken).numpy(),
            "full_free": (self.full["free"] | broken).numpy(), "last_broke": self.last_broke.numpy().copy(),
            "tau": np.full(n, float(self.tau)), "rivals": np.full(n, bool(self.rivals)),
            "edge": np.full(n, float(edge)), "restarted": self.restarted.numpy().copy(),
            "random": np.full(n, bool(unstable)), "batch": np.full(n, bool(batch_dependent))})
