"""``--converge``: per eps, the convergence ladder (``ladder/``) as work units of the run.

Why units like every other condition: a ladder on 10,000 ImageNet images is hours of GPU time; it
must resume after a kill and split over shards. One unit = one eps x one chunk of samples; its key
hashes the user's attacks (rung 0) and the ladder's settings, so a re-run resumes and another
tolerance is another condition.

Rung 0 is the user's own attack, read from its row (``ladder/rung0.py``, design 9): the ``adversarial`` unit's
walk, with its batches, generator seed, random starts and samples, notes each sample's first top-1 break and leaves
it in the chunk's memo; rung 0 takes the row's top-1 verdicts on the clean top-1 correct samples (the ladder's
verdict is top-1) and passes again only the first top-1 breaks of samples whose final point is correct (a walk that
stops at top-5, PGD's default, or not at all may carry a sample back across the boundary), so the converged value
is read against the number the user got and the ladder does not pay for the user's attack twice. A unit whose row
ran in another process walks the row again with the same function. The row's loss trace feeds the
incomplete-optimisation flags. Standard protocol only: the ladder's rungs work in pixel space on true labels.
"""
from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..attacks import make_attack
from ..core.labels import eps_text
from ..attacks.base import still_correct
from ..attacks.telemetry import neg_margin
from ..runtime.device import attack_precision
from ..runtime.health import check_finite
from ..runtime.progress import work_of
from ..specs import Unit, chunks
from . import Benchmark, Column, benchmarks
from .ladder import DESIGN, PROBE, Ladder, LadderSpec, RungResult, climb, planned_round, run_rung
from .ladder.rung0 import RowWalk, rung0_verdicts
from .ladder.probes import (BATCH_RTOL, NOISE_COSINE, UNSTABLE_RTOL, batch_dependent, batch_probe_rows, gradient_draws, gradients_mislead,
                            input_gradients, passes_differ, unavailable)
from .adv_images import keep_adversarial
from .walk import standard_walk

CONVERGE = "converge"


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"
META = {"attack_label": "Converged", "norm": "linf", "white_box": True, "worst_case": True, "paper_eps": float("nan")}


LADDER_NORMS = ("linf", "l2")  # the threat models the ladder has rungs for (each family in both forms)


def rung0_attacks(ctx: Any) -> Dict[Tuple[str, float], List[Tuple[str, str]]]:
    """(norm, eps) -> the user's worst-case attacks in that threat model at it, as (name, canonical settings JSON):
    the standard protocol's settings, i.e. exactly those its adversarial units hash and seed from."""
    out: Dict[Tuple[str, float], List[Tuple[str, str]]] = {}
    for a in ctx.spec.attacks:
        attack = make_attack(a.attack, **a.params)
        params = attack.params()
        if attack.norm not in LADDER_NORMS or not attack.worst_case:
            continue
        js = json.dumps(params, sort_keys=True)
        lst = out.setdefault((attack.norm, float(params["eps"])), [])
        if (a.attack, js) not in lst:
            lst.append((a.attack, js))
    return out


def converge_units(ctx: Any) -> List[Unit]:
    """One unit per eps and chunk (added to the adversarial plan when ``spec.converge`` is set)."""
    spec = LadderSpec.from_options(ctx.spec.converge)
    units: List[Unit] = []
    for (norm, eps), rung0 in rung0_attacks(ctx).items():
        key = {"rung0": [[n, json.loads(p)] for n, p in rung0], "ladder": spec.as_dict(), "design": DESIGN}
        if norm != "linf":  # (an L-inf unit's key is what it was before the ladder had L2 rungs)
            key["norm"] = norm
        js = json.dumps(key, sort_keys=True)
        for s, e in chunks(len(ctx.indices), ctx.spec.chunk_size):
            units.append(Unit(CONVERGE, CONVERGE, eps, js, "", s, e))
    return units


def row_memo_key(ctx: Any, unit: Unit) -> Optional[Tuple[str, str, str]]:
    """The chunk-memo key under which an ``adversarial`` unit leaves its walk for rung 0 (``ladder/rung0.py``), or
    None where no converge unit reads it (another attack, an indicator's unconstrained run)."""
    if unit.benchmark != "adversarial" or unit.condition:
        return None
    for lst in rung0_attacks(ctx).values():
        if (unit.attack, unit.params) in lst:
            return _memo_key(unit.attack, unit.params)
    return None


def _memo_key(name: str, params_json: str) -> Tuple[str, str, str]:
    return ("rung0", name, params_json)


@benchmarks.register(CONVERGE)
class Converge(Benchmark):
    """The ladder's units; planned by the ``adversarial`` benchmark when ``--converge`` is given."""

    name = CONVERGE

    def plan(self, ctx: Any) -> List[Unit]:
        return converge_units(ctx)

    def run_unit(self, ctx: Any, unit: Unit) -> Any:
        from . import gather

        parts = [self._run(ctx, unit)]
        return gather(parts)

    def passes(self, ctx: Any, unit: Unit) -> Tuple[float, float]:
        """Rung 0, the probes and round 1 (ranked APGD-T, APGD-CE, FAB-T, Square) on every sample: what a ladder costs
        on a model no rung breaks a sample of and on which no sample is near (the full budgets, and EOT and SPSA, run
        only where called for: the bar makes room for each round as it is decided)."""
        p = json.loads(unit.params)
        s = LadderSpec.from_options(p["ladder"])
        norm = p.get("norm", "linf")
        # the probes (an upper bound per sample): the repeated pass, the batch-context passes, the shared input
        # gradients, the misleading probe's two steps (its own gradient outside fp32), the second gradient draw
        fwd, fb = 7.0, 4.0
        for rung in planned_round(s, float(unit.eps), 1, unstable=False, no_grad=False, norm=norm):
            f, b = make_attack(rung.attack, **rung.params).passes()
            fwd, fb = fwd + f + 1, fb + b  # + the verdict pass
        # rung 0 reads the user's row and passes at most each sample's first top-1 break (ladder/rung0.py); a unit
        # whose row ran elsewhere walks it again and makes room on the bar for that as it goes
        return fwd + len(p["rung0"]), fb

    def _run(self, ctx: Any, unit: Unit) -> Dict[str, Column]:
        p = json.loads(unit.params)
        spec = LadderSpec.from_options(p["ladder"])
        norm = p.get("norm", "linf")
        model, attacked = ctx.verdict_model(), ctx.attacked_model()
        xs, ys, sids, logits = [], [], [], []
        robust_parts, flag_parts, fwd0, bwd0, worst_parts = [], [], [], [], []
        rung0 = [(name, json.dumps(params, sort_keys=True)) for name, params in p["rung0"]]
        gens = [ctx.generator(Unit("adversarial", name, unit.eps, js, "", unit.start, unit.stop)) for name, js in rung0]
        for x, y, ids, memo in ctx.batches(unit):
            clean = memo.get("clean_logits") if memo is not None else None
            if clean is None:
                with torch.inference_mode():
                    clean = model(x).float()
                check_finite(clean, ctx, unit, "clean")
            c1 = still_correct(clean, y, 1)
            robust, flagged, f0, b0, worst = self._rung0(ctx, unit, rung0, gens, x, y, clean, memo)
            xs.append(x)
            ys.append(y)
            sids += list(ids)
            logits.append(clean)
            robust_parts.append(robust)
            flag_parts.append(flagged)
            fwd0.append(f0)
            bwd0.append(b0)
            worst_parts.append(worst.cpu())
            ctx.spend(work_of(float(f0.sum()), float(b0.sum())) + len(ids))  # rung 0 and the clean pass
        x, y, clean = torch.cat(xs), torch.cat(ys), torch.cat(logits)
        c1 = still_correct(clean, y, 1)
        ladder = Ladder(robust=torch.cat(robust_parts).cpu().clone(), worst=torch.cat(worst_parts).cpu(),
                        clean_margin=-neg_margin(clean.float(), y).cpu())
        rung0_robust = ladder.robust.clone()
        everyone = torch.arange(len(y))
        ladder.charge("user", everyone, torch.cat(fwd0), torch.cat(bwd0))
        # rung 0 attacks every clean top-1 correct sample (the verdict is top-1: a sample wrong at the clean point is
        # broken there, and walking it costs passes that decide nothing; design 8)
        ladder.history.append({"id": "user", "attacked": int(c1.sum()), "broke": int((c1.cpu() & ~rung0_robust).sum()),
                               "full": True, "label": "+".join(n for n, _ in rung0), "round": 0, "family": "",
                               "scope": "clean top-1 correct",
                               "settings": " + ".join(make_attack(n, **json.loads(js)).describe() for n, js in rung0)
                               + ": your row's walk, its verdict also at each sample's first top-1 break"})
        for i in (c1.cpu() & ~rung0_robust).nonzero().squeeze(1).tolist():
            ladder.broken_by[i] = "user"
        flagged = torch.cat(flag_parts).cpu()
        # probes (design 8: each pass once): the first batch passed again as the clean pass scored it (randomised
        # model? its clean-correct samples compared; a randomised model is random in any batch) and reused as the
        # batch-context probe's own repeated pass (outputs depend on the batch?); then, on the still-robust samples,
        # one forward pass for the CE and DLR input gradients that the gradient probes share
        bs = max(1, ctx.batch_size)
        first = slice(0, min(bs, len(y)))  # the first batch, as the clean pass scored it
        with torch.no_grad():
            again = model(x[first]).float()
        sel = c1[first].to(again.device)
        sel = sel if bool(sel.any()) else torch.ones_like(sel)  # no clean-correct sample there: compare them all
        unstable = passes_differ(again[sel], clean[first].to(again.device)[sel].float(), UNSTABLE_RTOL)
        dependent = batch_dependent(model, x[first], clean[first], BATCH_RTOL, again=again)
        alone, company = batch_probe_rows(first.stop)
        for k in (first.stop, alone, company):
            ladder.charge(PROBE, torch.arange(k), torch.ones(k), torch.zeros(k))
        no_grad = torch.zeros(len(y), dtype=torch.bool)
        rob = ladder.robust.nonzero().squeeze(1)
        shared = ctx.spec.precision == "fp32"  # the DLR gradient is the misleading probe's own (it runs in fp32)
        gen = ctx.generator(unit)
        random_grads = False
        for s in range(0, len(rob), bs):
            idx = rob[s:s + bs]
            xi, yi = x[idx.to(x.device)], y[idx.to(x.device)]
            with attack_precision(ctx.device, ctx.spec.precision):
                g_ce, g_dlr = input_gradients(attacked, xi, yi)
            no_grad[idx] = unavailable(g_ce, g_dlr, len(xi), xi.device).cpu()
            ladder.misleading[idx] = gradients_mislead(attacked, xi, yi, grad=g_dlr if shared else None).cpu()
            ladder.charge(PROBE, idx, torch.full((len(idx),), 3.0 if shared else 4.0),
                          torch.full((len(idx),), 2.0 if shared else 3.0))
            # random gradients (a second CE draw differs from the first), on the first batch of still-robust samples
            # with a gradient; if so, on all of them, flagging where two draws agree less than the noise between
            # them (mostly noise: the plain gradient rungs' failure is no evidence there)
            if s and not random_grads:
                continue  # a deterministic gradient: the first batch says so
            has = ~no_grad[idx]
            if not bool(has.any()):
                continue
            h = has.to(xi.device)
            with attack_precision(ctx.device, ctx.spec.precision):
                differ, cos = gradient_draws(attacked, xi[h], yi[h], UNSTABLE_RTOL,
                                             first=None if g_ce is None else g_ce[h])
            random_grads |= differ
            ladder.misleading[idx[has]] |= (cos < NOISE_COSINE).cpu()
            drawn = torch.full((int(has.sum()),), 1.0 if g_ce is not None else 2.0)
            ladder.charge(PROBE, idx[has], drawn, drawn)
        probe_f, probe_b = float(ladder.forward[PROBE].sum()), float(ladder.backward[PROBE].sum())
        ctx.spend(work_of(max(0.0, probe_f - probe_b), probe_b))
        where = f"converge eps={eps_text(unit.eps, norm)} [{unit.start}:{unit.stop}]"

        def on_round(r: int, scopes: Dict[str, torch.Tensor], rungs: List[Any]) -> None:
            """The round's planned passes, made room for on the bar (``passes`` prices round 1's families only; the
            EOT and SPSA rungs and the later rounds are decided as the ladder runs)."""
            cost = 0.0
            for rung in rungs:
                scope = scopes["no-gradient"] if rung.scope == "no-gradient" else scopes[rung.kind]
                f, b = make_attack(rung.attack, **rung.params).passes()
                cost += int((ladder.robust & scope).sum()) * work_of(f + 1, b)
            ctx.reserve(cost)

        def run(rung: Any, idx: torch.Tensor) -> RungResult:
            d = idx.to(x.device)
            left = int(ladder.robust.sum())
            t0 = time.time()

            def report(done: int, total: int, broken: int, fwd: float = 0.0, bwd: float = 0.0) -> None:
                ctx.spend(work_of(max(0.0, fwd - bwd), bwd))  # a pass with a backward is priced as one pair
                rate = (time.time() - t0) / max(1, done)
                ctx.note(f"{where} round {rung.round} {rung.id}: {done}/{total} attacked, {broken} broken "
                         f"({left - broken} of {len(y)} robust), rung ETA {_clock(rate * (total - done))}")

            report(0, len(idx), 0)
            with attack_precision(ctx.device, ctx.spec.precision):
                return run_rung(rung, attacked, model, x[d], y[d], gen, bs,
                                check=lambda t, stage: check_finite(t, ctx, unit, stage), report=report)

        climb(ladder, spec, unit.eps, run, unstable=unstable, no_grad=no_grad, batch_dependent=dependent,
              random_gradients=random_grads, on_round=on_round, norm=norm)
        keep_adversarial(ctx, unit, sids, x, ladder.worst, y, norm, unit.eps)  # --save-adv: each sample's worst case
        rec = self._records(ladder, sids, x, y, clean, c1, rung0_robust, flagged, no_grad, unstable, dependent,
                            spec, rung0, norm)
        rec.update(evidence_columns(ladder, spec, unstable, random_grads))
        return rec

    def _rung0(self, ctx: Any, unit: Unit, rung0: List[Tuple[str, str]], gens: List[torch.Generator], x: torch.Tensor,
               y: torch.Tensor, clean: torch.Tensor, memo: Optional[Dict[Any, Any]]
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The user's attacks on this batch, read from their rows' walks (``ladder/rung0.py``; walked again with the
        row's generator where the row ran in another process): (top-1 robust after all of them,
        incomplete-optimisation flag, forward, backward passes rung 0 made, the worst-case point so far on the host:
        the first breaking point, else the clean image)."""
        c1, c5 = still_correct(clean, y, 1), still_correct(clean, y, 5)
        robust = c1.clone()
        worst = x.detach().cpu().clone()
        flagged = torch.zeros(len(y), dtype=torch.bool, device=y.device)
        fwd = torch.zeros(len(y), device=y.device)

        def verdict(points: torch.Tensor) -> torch.Tensor:
            with torch.inference_mode():
                z = ctx.verdict_model()(points).float()
            check_finite(z, ctx, unit, "verdict")
            return z

        for (name, js), gen in zip(rung0, gens):
            walk = memo.pop(_memo_key(name, js), None) if memo is not None else None
            if walk is None:  # the row ran in another process (or before a resume): its walk again, as it ran
                attack = make_attack(name, **json.loads(js))
                attack.keep_first_break = True
                f, b = attack.passes()
                ctx.reserve(work_of(float(c5.sum()) * f + len(y), float(c5.sum()) * b))
                sel = c5.nonzero().squeeze(1)  # the row attacks the clean top-5 correct samples
                x_adv, logits = standard_walk(ctx, unit, attack, x, y, sel, gen)
                check_finite(logits, ctx, unit, "verdict")
                tel = attack.telemetry
                if tel is not None:
                    ctx.spend(work_of(float(tel.forward.sum()) + len(y), float(tel.backward.sum())))
                walk = RowWalk.of(attack, sel, x_adv, logits, y)
            ok, trend, f0, w = rung0_verdicts(walk, x, y, c1, verdict)
            newly = (robust & ~ok).cpu()
            worst[newly] = w[newly]
            robust &= ok
            flagged |= trend
            fwd += f0
        return robust, flagged & robust, fwd, torch.zeros_like(fwd), worst

    def _records(self, ladder: Ladder, sids: List[str], x: torch.Tensor, y: torch.Tensor, clean: torch.Tensor,
                 c1: torch.Tensor, rung0_robust: torch.Tensor, flagged: torch.Tensor, no_grad: torch.Tensor,
                 unstable: bool, dependent: bool, spec: LadderSpec, rung0: List[Tuple[str, Dict[str, Any]]],
                 norm: str = "linf") -> Dict[str, Column]:
        n = len(y)
        # the worst-case point of each sample: the point of the rung that broke it (the clean image while robust)
        delta = (ladder.worst.float() - x.detach().cpu().float()).flatten(1)
        c5 = still_correct(clean, y, 5).cpu()
        rec: Dict[str, Column] = {"sample_id": sids, "label": y.cpu(), "clean_pred": clean.argmax(1).cpu(),
                                  "clean_correct_top1": c1.cpu(), "clean_correct_top5": c5,
                                  "correct_top1": ladder.robust.clone(), "correct_top5": None,
                                  "attacked": c1.cpu(), "rung0_correct_top1": rung0_robust,
                                  "broken_by": list(ladder.broken_by),
                                  "flag_incomplete": flagged, "grad_unavailable": no_grad,
                                  "pert_linf": delta.abs().amax(1), "pert_l2": delta.norm(dim=1),
                                  "pert_l1": delta.abs().sum(1)}
        tot_f = torch.zeros(n, dtype=torch.float64)
        tot_b = torch.zeros(n, dtype=torch.float64)
        for rid in ladder.forward:
            rec[f"fwd@{rid}"] = ladder.forward[rid].numpy()
            rec[f"bwd@{rid}"] = ladder.backward[rid].numpy()
            tot_f += ladder.forward[rid]
            tot_b += ladder.backward[rid]
        rec["passes_forward"], rec["passes_backward"] = tot_f.numpy(), tot_b.numpy()
        h = ladder.history
        rec.update({"converge_status": ladder.status, "converge_detail": ladder.detail,
                    "converge_rungs": ",".join(r["id"] for r in h), "converge_labels": ",".join(r["label"] for r in h),
                    "converge_attacked": ",".join(str(r["attacked"]) for r in h),
                    "converge_broke": ",".join(str(r["broke"]) for r in h),
                    "converge_rounds": ",".join(str(r.get("round", 1)) for r in h),
                    "converge_history": json.dumps(h, sort_keys=True),
                    "converge_unstable": bool(unstable), "converge_batch_dependent": bool(dependent),
                    "converge_tolerance": spec.tolerance(n), "converge_reduced": ", ".join(spec.reductions()),
                    **META, "norm": norm})
        return rec


def evidence_columns(ladder: Ladder, spec: LadderSpec, unstable: bool, random_grads: bool) -> Dict[str, Column]:
    """The stop rule's evidence per sample, kept in the records so a condition is judged from them as each unit was
    (``results/summaries/converge.py``): the lowest margins the gradient families and the random search reached
    (and the clean one), the probe's flag, which kinds' full budget the sample had, whether the unit's last round
    broke it, the unit's last tau, whether Square was the gradient families' rival there, the edge share and which
    samples had their fresh start."""
    return {"margin_clean": ladder.clean_margin.numpy(), "margin_gradient": ladder.margin["gradient"].numpy(),
            "margin_free": ladder.margin["free"].numpy(), "converge_grad_misleads": ladder.misleading.clone(),
            "converge_full_gradient": ladder.full["gradient"].clone(), "converge_full_free": ladder.full["free"].clone(),
            "converge_last_broke": ladder.last_broke.clone(), "converge_tau": float(ladder.tau),
            "converge_rivals": bool(ladder.rivals), "converge_edge": float(spec.edge),
            "converge_restarted": ladder.restarted.clone(),
            "converge_random_gradients": bool(random_grads)}
