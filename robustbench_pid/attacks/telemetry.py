"""Per-sample telemetry of one attack call: what the attack spent on each sample and how its loss moved.

Why in the attacks' base class: every attack evaluates its loss at each iterate anyway, so counting
passes and keeping a running start/best value per sample costs a few elementwise operations on
``n``-sized tensors per step, on the batch's device (no host sync mid-attack). The per-iteration
loss of every sample (the *trace*) is kept only when asked (``--trace`` / ``--indicators``).

The telemetry loss is the attack's own loss oriented so that HIGHER is more adversarial:
cross-entropy for FGSM/PGD/PGD-L2/SLD, ``max_{j != y} z_j - z_y`` (the negated margin) for SPSA and
CW (CW's distance term is left out: it is not what decides success).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

# Off only in scripts/bench_evidence.py, which times a run with and without the telemetry.
ENABLED = [True]


def neg_margin(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per sample ``max_{j != y} z_j - z_y`` (> 0 once misclassified at top-1)."""
    z_y = logits.gather(1, y[:, None]).squeeze(1)
    other = logits.masked_fill(F.one_hot(y, logits.shape[1]).bool(), float("-inf")).amax(1)
    return other - z_y


def attack_loss(kind: str, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The telemetry loss of ``kind`` ("ce" or "margin") per sample, in fp32."""
    logits = logits.float()
    return F.cross_entropy(logits, y, reduction="none") if kind == "ce" else neg_margin(logits, y)


class Telemetry:
    """Running per-sample counters of one attack call over a batch of ``n`` samples."""

    def __init__(self, n: int, device: torch.device, trace: bool = False) -> None:
        z = lambda dtype=torch.float32: torch.zeros(n, dtype=dtype, device=device)  # noqa: E731
        self.n = n
        self.forward, self.backward, self.iterations, self.grad_zero_steps = z(), z(), z(), z()
        self.loss_start = torch.full((n,), float("nan"), device=device)
        self.loss_best = torch.full((n,), float("-inf"), device=device)
        self.ever_adversarial = z(torch.bool)
        self.keep_trace = trace
        self._steps: List[Tuple[Optional[torch.Tensor], torch.Tensor]] = []

    def charge(self, rows: Optional[torch.Tensor], forward: int = 1, backward: int = 0) -> None:
        """Passes spent on ``rows`` (indices into the batch; None: every sample) without a loss value."""
        sel = slice(None) if rows is None else rows
        self.forward[sel] += forward
        if backward:
            self.backward[sel] += backward

    def observe(self, rows: Optional[torch.Tensor], loss: torch.Tensor, logits: torch.Tensor, y: torch.Tensor,
                grad: Optional[torch.Tensor] = None, forward: int = 1, backward: int = 1) -> None:
        """One iterate of ``rows`` (None: the whole batch): its loss (higher = more adversarial),
        logits (for "was it adversarial at top-1"), and gradient (for "was it zero or not finite")."""
        sel = slice(None) if rows is None else rows
        loss = loss.detach().float()
        self.charge(rows, forward, backward)
        first = self.iterations[sel] == 0
        self.iterations[sel] += 1
        self.loss_start[sel] = torch.where(first, loss, self.loss_start[sel])
        self.loss_best[sel] = torch.maximum(self.loss_best[sel], loss)
        self.ever_adversarial[sel] |= logits.detach().argmax(1) != y
        if grad is not None:
            g = grad.detach().flatten(1).abs().amax(1)
            self.grad_zero_steps[sel] += (~(g > 0) | ~torch.isfinite(g)).float()
        if self.keep_trace:
            self._steps.append((rows, loss))

    def trace(self) -> torch.Tensor:
        """(n, steps) loss per iterate, NaN where a sample was not evaluated (stopped early).

        Step ``t`` is the ``t``-th call of :meth:`observe`; every attack here observes all its
        still-active samples once per iteration, so a column is one iteration."""
        out = torch.full((self.n, len(self._steps)), float("nan"), device=self.loss_start.device)
        for t, (rows, loss) in enumerate(self._steps):
            if rows is None:
                out[:, t] = loss
            else:
                out[rows, t] = loss
        return out

    def columns(self) -> Dict[str, torch.Tensor]:
        """The per-sample tensors the benchmark puts into records (on the device)."""
        seen = self.iterations > 0
        return {"passes_forward": self.forward, "passes_backward": self.backward, "iterations": self.iterations,
                "loss_start": self.loss_start, "loss_best": torch.where(seen, self.loss_best, torch.nan),
                "ever_adversarial": self.ever_adversarial, "grad_zero_steps": self.grad_zero_steps}


class Counted(torch.nn.Module):
    """A model that counts the images it forwards and the images gradients flow back through.

    For library attacks (Square, AutoAttack) whose loops we do not write, and which pass the model
    sub-batches of their own choosing. Given the batch's clean inputs (``originals``), each forwarded row
    is charged to the sample it is nearest to in L-inf (an attack's iterate stays within eps of its own
    image, and two test images are much further apart than 2 eps), so records carry per-sample counts;
    without them :meth:`settle` charges every sample the batch mean (the mean passes per sample of a
    condition are exact either way). Identical clean images (a dataset may hold one image twice) cannot
    be told apart by nearness: their rows are pooled and shared equally by the copies. Attribution costs
    one (rows x batch) distance per call, about a percent of a forward pass of the models here."""

    def __init__(self, net: torch.nn.Module, originals: Optional[torch.Tensor] = None,
                 labels: Optional[torch.Tensor] = None, eps: Optional[float] = None, norm: str = "linf") -> None:
        super().__init__()
        self.net = net
        # with labels and eps: the verdict margin of every forwarded row inside its sample's L-inf eps-ball, kept for
        # :meth:`progress` (how far each sample's search came, and how much of that in the last half of its passes)
        self._labels = None if labels is None or originals is None else labels.detach()
        self._eps = eps
        self._norm = norm  # the ball ``eps`` is a radius of: a row outside it decides nothing (FAB's outside points)
        self._seen: List[Tuple[torch.Tensor, torch.Tensor]] = []
        self.n_forward = 0
        self.n_backward = 0
        self._orig = None if originals is None else originals.detach().flatten(1).float()
        n, dev = (0, None) if originals is None else (len(originals), originals.device)
        # on the batch's device: counting must not make the attack wait for the host every call
        self.per_forward = torch.zeros(n, dtype=torch.float64, device=dev)
        self.per_backward = torch.zeros(n, dtype=torch.float64, device=dev)
        self._group = None if originals is None else _copies(self._orig)

    def _shared(self, counts: torch.Tensor) -> torch.Tensor:
        """Counts charged to the first of identical images, pooled and split equally among its copies."""
        if self._group is None:
            return counts
        first, size = self._group
        dev = counts.device
        pooled = torch.zeros_like(counts).index_add_(0, first.to(dev), counts)
        return pooled[first.to(dev)] / size.to(dev, counts.dtype)

    def owners(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """Index of the nearest original (L-inf) of each row of ``x``; None without originals or on a
        shape the originals do not have (then counts fall back to the batch mean)."""
        got = self._nearest(x)
        return None if got is None else got[0]

    def _nearest(self, x: torch.Tensor) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """(owner index, L-inf distance to it) per row of ``x``, or None (see :meth:`owners`)."""
        if self._orig is None or x.flatten(1).shape[1] != self._orig.shape[1]:
            return None
        with torch.no_grad():
            rows = x.detach().flatten(1).float()
            if not len(rows):  # an empty batch (a model probed with no rows): nobody's pass
                dev = self.per_forward.device
                return torch.zeros(0, dtype=torch.long, device=dev), torch.zeros(0, device=dev)
            parts = [torch.cdist(rows[i:i + 256], self._orig, p=float("inf")).min(1) for i in range(0, len(rows), 256)]
        dev = self.per_forward.device
        return torch.cat([p.indices for p in parts]).to(dev), torch.cat([p.values for p in parts]).to(dev)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        near = self._nearest(x)
        who = None if near is None else near[0]
        out = self.net(x)
        self.n_forward += len(x)
        if who is not None:
            self.per_forward += torch.bincount(who, minlength=len(self.per_forward)).double()
            if self._labels is not None and out.dim() == 2:
                dist = near[1]
                if self._norm == "l2":  # the owner is the nearest in L-inf; the ball is an L2 one
                    with torch.no_grad():
                        rows = x.detach().flatten(1).float().to(self._orig.device)
                        dist = (rows - self._orig[who.to(self._orig.device)]).norm(dim=1).to(dist.device)
                self._observe(who, dist, out)
        else:
            self._orig = None  # one row without an owner: the per-sample counts would be incomplete
            self._labels = None
        if out.requires_grad:
            n = len(x)

            def hook(grad: torch.Tensor) -> None:
                self.n_backward += n
                if who is not None:
                    self.per_backward += torch.bincount(who, minlength=len(self.per_backward)).double()

            out.register_hook(hook)
        # under autocast the logits are half precision; the library writes them into fp32 buffers (Square's
        # margins), so they leave here as fp32 whatever precision the passes ran in
        return out.float() if out.is_floating_point() and out.dtype != torch.float32 else out

    def _observe(self, who: torch.Tensor, dist: torch.Tensor, logits: torch.Tensor) -> None:
        """Keep each row's verdict margin ``z_y - max_{j != y} z_j`` (> 0: still correct), +inf for a row outside
        its sample's eps-ball (FAB steps outside and projects back; such a point decides nothing)."""
        with torch.no_grad():
            m = -neg_margin(logits.detach().float(), self._labels.to(logits.device)[who.to(logits.device)])
            m = m.to(who.device)
            if self._eps is not None:
                m = torch.where(dist <= float(self._eps) * (1 + 1e-4) + 1e-6, m, torch.full_like(m, float("inf")))
        self._seen.append((who, m))

    def progress(self) -> Optional[Dict[str, torch.Tensor]]:
        """Per sample, from the rows forwarded inside its eps-ball: ``margin_best`` (the lowest verdict margin:
        how near the boundary the search came; <= 0 once it crossed), ``margin_half`` (the lowest over the
        first half of the sample's passes, so ``margin_half - margin_best`` is what the last half still gained)
        and ``passes`` (rows forwarded for the sample); +inf where a sample had no such row. None without
        labels. Why here: the library loops are not ours, but every point they try passes through this model."""
        if self._labels is None or self._orig is None:
            return None
        n, dev = len(self._orig), self.per_forward.device
        best = torch.full((n,), float("inf"), device=dev)
        half = best.clone()
        if not self._seen:
            return {"margin_best": best, "margin_half": half, "passes": torch.zeros(n, device=dev)}
        who = torch.cat([w for w, _ in self._seen])
        m = torch.cat([v for _, v in self._seen])
        order = torch.argsort(who, stable=True)  # each sample's rows, in the order they were forwarded
        w, mm = who[order], m[order]
        counts = torch.bincount(who, minlength=n)
        starts = torch.cumsum(counts, 0) - counts
        pos = torch.arange(len(w), device=dev) - starts[w]
        first = pos < torch.div(counts[w] + 1, 2, rounding_mode="floor")
        best = best.scatter_reduce(0, w, mm, "amin")
        half = half.scatter_reduce(0, w[first], mm[first], "amin")
        return {"margin_best": best, "margin_half": half, "passes": counts.float()}

    def settle(self, telemetry: Optional[Telemetry]) -> None:
        if telemetry is None or not telemetry.n:
            return
        if self._orig is not None and len(self.per_forward) == telemetry.n:
            dev = telemetry.forward.device
            telemetry.forward += self._shared(self.per_forward).to(dev, telemetry.forward.dtype)
            telemetry.backward += self._shared(self.per_backward).to(dev, telemetry.backward.dtype)
        else:
            telemetry.forward += self.n_forward / telemetry.n
            telemetry.backward += self.n_backward / telemetry.n


def _copies(flat: torch.Tensor) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """For images given as rows: (index of the first identical row, number of identical rows) per row,
    or None when all rows differ (the usual case: nothing to share)."""
    if len(flat) < 2:
        return None
    _, inverse, counts = torch.unique(flat, dim=0, return_inverse=True, return_counts=True)
    if int(counts.max()) < 2:
        return None
    n = len(flat)
    first = torch.full((len(counts),), n, dtype=torch.long, device=flat.device)
    first = first.scatter_reduce(0, inverse, torch.arange(n, device=flat.device), reduce="amin")
    return first[inverse], counts[inverse]
