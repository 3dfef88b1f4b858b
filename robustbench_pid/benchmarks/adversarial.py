"""Clean accuracy and attacks, in the ``standard`` or ``paper`` protocol (recorded in every record).

standard (the default, the one to trust): the model takes [0, 1] pixels and normalizes inside;
  attacks work in pixel space and clip to [0, 1]; they use the true labels; eps is in pixel units.
  Samples whose clean top-5 is already wrong are not attacked (x itself lies in the eps-ball, so
  they are not robust at either top-1 or top-5); a sample counts as robust only if it is correct
  both clean and under attack (the worst case over the ball), as AutoAttack scores it. Random
  noise is not a worst case and is scored as plain accuracy on the noisy images.

paper: reproduces the PIDformer / RPC-attention evaluation code (rachtsy/KPCA_code, cleverhans v4
  PyTorch functions) as it actually ran. Every quirk it reproduces, on purpose:
  1. attacks see the network without its normalization layer and perturb the *normalized* tensor,
     so eps is in normalized units: 3/255 there is 3/255 * std in pixels (~0.9/255 for ImageNet's
     std ~0.226; 1.5/255 for the digits models' std 0.5), and every threat model is smaller than
     its label says;
  2. no clipping: the perturbed tensor may leave the image of [0, 1] under the normalization, i.e.
     it need not be an image at all;
  3. ``y`` was not passed to cleverhans, so the labels attacked are the model's own clean
     predictions; accuracy is still scored against the true labels, as plain accuracy of the
     perturbed tensor (a sample misclassified clean can come out "correct" after the attack);
  4. every sample is attacked and nothing stops early (``early_stop=False``): cleverhans returns
     the last iterate, which can be correct again after an earlier success;
  5. PGD takes 20 steps of 0.15 * eps with a random start (an unset PGD step becomes
     ``step_size_factor = 0.15`` here), so the walk covers 3 eps and ends wherever it ends;
  6. SPSA: eps 0.1, 40 iterations, lr 0.01, delta 0.01, 128 samples (the attack's defaults), but
     with the gradient estimated at the current point: cleverhans' PyTorch spsa estimates it at
     2x (cleverhans#1249), which we do not reproduce: the published SPSA numbers came from that
     broken estimator, so ours need not match them;
  7. SLD: L1 eps 10, step 1, 20 iterations, q 99; noise: uniform +-0.3 (normalized units); FGSM
     eps 3/255; the eps sweep is i/255 for i = 1..6, one run per eps.
  Attacks whose settings the protocol does not touch (FGSM, SLD, noise, SPSA, CW, Square,
  AutoAttack) differ between protocols only in space, labels and clipping.

Why ``standard`` is the one to trust: its threat model is the one the numbers claim (an eps-ball of
images in pixel units), the perturbed inputs are valid images, the attack is told the true label
(so it cannot "attack" a wrong prediction into a right one), samples already wrong are counted as
not robust, and iterative attacks keep their first success. The ``paper`` numbers are only for
comparing with the published tables.

Its tidy rows (``robustbench_pid.results.summaries.adversarial``, torch-free) add a derived ``worst-case`` row
per (norm, eps): a sample is robust only if it survived every worst-case attack run at that eps (as
AutoAttack reports its ensemble).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from ..attacks import make_attack
from ..attacks.base import still_correct
from ..results.report.indicators import UNCONSTRAINED
from ..runtime.device import attack_precision
from ..runtime.health import check_finite
from ..specs import Unit, chunks
from . import Benchmark, Column, benchmarks
from . import evidence
from .adv_images import keep_adversarial
from .walk import standard_walk
from .ladder.rung0 import RowWalk


def attack_settings(ctx: Any, spec: Any) -> dict:
    """The attack's full settings for this protocol (what goes into records and unit keys)."""
    return protocol_params(spec.attack, spec.params, ctx.spec.protocol)


PAPER_PGD_STEP_FACTOR = 0.15  # the authors' cleverhans call: eps_iter = 0.15 * eps


def protocol_params(name: str, params: dict, protocol: str) -> dict:
    """The settings an attack runs with under ``protocol`` (see the module docstring, quirks 4-5)."""
    attack = make_attack(name, **params)
    if protocol == "paper":
        if "early_stop" in attack.param_names():
            attack = attack.with_params(early_stop=False)
        if name == "pgd" and attack.step_size is None and attack.step_size_factor is None:
            attack = attack.with_params(step_size_factor=PAPER_PGD_STEP_FACTOR)
    return attack.params()


@dataclass
class AttackedBatch:
    """One batch of a unit: clean verdicts and, for an attack, the adversarial pixels and logits."""

    x: torch.Tensor
    y: torch.Tensor
    sample_ids: List[str]
    clean_pred: torch.Tensor
    clean_correct_top1: torch.Tensor
    clean_correct_top5: torch.Tensor
    attack: Any = None  # the Attack object, None for the clean unit
    paper: bool = False
    x_adv: Optional[torch.Tensor] = None  # adversarial images in pixel space (x itself where not attacked)
    adv_logits: Optional[torch.Tensor] = None  # fp32 logits of the adversarial inputs
    attacked: Optional[torch.Tensor] = None  # per sample (on the device): did the attack run on it
    grad_zero: Optional[torch.Tensor] = None  # per sample (on the device): all-zero input gradient
    grad_zero_known: bool = False  # False when the attack does not report grad_zero
    evidence: Optional[Dict[str, Any]] = None  # telemetry, indicator measurements, agreement (evidence.py)


def attack_batches(ctx: Any, unit: Unit) -> Iterator[AttackedBatch]:
    """The adversarial benchmark's work on a unit, batch by batch: the runner's records and
    ``rbp.attack``'s images both come from here, so the two cannot drift apart.

    The caller sets up the unit's global RNGs (``run_context.unit_rng``); the attack's generator is
    ``ctx.generator(unit)``, consumed batch after batch.
    """
    model = ctx.verdict_model()
    paper = ctx.spec.protocol == "paper"
    attack = None if unit.attack == "clean" else make_attack(unit.attack, **json.loads(unit.params))
    gen = ctx.generator(unit)
    row_key = None
    if attack is not None and not paper and getattr(ctx.spec, "converge", None) is not None:
        from .converge import row_memo_key  # --converge: rung 0 reads this unit's walk from the chunk's memo

        row_key = row_memo_key(ctx, unit)
    for x, y, sids, memo in ctx.batches(unit):
        row_key = row_key if memo is not None else None
        clean_logits = memo.get("clean_logits") if memo is not None else None
        if clean_logits is None:  # computed (and checked) once per batch of a held chunk, by its first unit
            with torch.inference_mode():
                clean_logits = model(x).float()
            check_finite(clean_logits, ctx, unit, "clean")
            if memo is not None:
                memo["clean_logits"] = clean_logits
        clean_pred = clean_logits.argmax(1)
        c1, c5 = still_correct(clean_logits, y, 1), still_correct(clean_logits, y, 5)
        b = AttackedBatch(x, y, sids, clean_pred, c1, c5, attack, paper)
        if attack is None:
            yield b
            continue
        grad_zero = torch.zeros(len(y), dtype=torch.bool, device=y.device)
        # None when the attack does not report it (black box, or a library attack such as
        # AutoAttack whose gradients we do not see): "no zero gradients" would be a claim
        gz_known = False
        if paper:
            net = ctx.attacked_net()
            z = ctx.model.normalize(x)
            with attack_precision(ctx.device, ctx.spec.precision):
                z_adv = attack(net, z, clean_pred, bounds=None, generator=gen, trace=evidence.wants_trace(ctx))
            check_finite(z_adv, ctx, unit, "attack")
            x_adv_pixels = ctx.model.denormalize(z_adv)
            with torch.inference_mode():
                adv_logits = net(z_adv).float()
            attacked = torch.ones(len(y), dtype=torch.bool, device=y.device)
            sel, state = attacked.nonzero().squeeze(1), None
            if "grad_zero" in attack.stats:
                grad_zero, gz_known = attack.stats["grad_zero"].to(y.device), True
        else:
            attacked = c5.clone() if attack.worst_case else torch.ones_like(c5)
            sel = attacked.nonzero().squeeze(1)
            state = gen.get_state() if evidence.generator_state(ctx) else None
            attack.keep_first_break = row_key is not None
            x_adv, adv_logits = standard_walk(ctx, unit, attack, x, y, sel, gen)
            if len(sel) and "grad_zero" in attack.stats:
                grad_zero[sel] = attack.stats["grad_zero"].to(y.device)
                gz_known = True
            x_adv_pixels = x_adv
            if row_key is not None:  # --converge: rung 0 reads this walk (benchmarks/converge.py)
                memo[row_key] = RowWalk.of(attack, sel, x_adv, adv_logits, y)
        check_finite(adv_logits, ctx, unit, "verdict")
        b.x_adv, b.adv_logits, b.attacked, b.grad_zero, b.grad_zero_known = (
            x_adv_pixels, adv_logits, attacked, grad_zero, gz_known)
        b.evidence = evidence.batch_evidence(ctx, unit, b, sel, state)
        yield b


@benchmarks.register("adversarial")
class Adversarial(Benchmark):
    name = "adversarial"

    def plan(self, ctx: Any) -> List[Unit]:
        units: List[Unit] = []
        spans = chunks(len(ctx.indices), ctx.spec.chunk_size)
        for s, e in spans:
            units.append(Unit("adversarial", "clean", 0.0, "{}", "", s, e))
        for a in ctx.spec.attacks:
            params = attack_settings(ctx, a)
            js = json.dumps(params, sort_keys=True)
            for s, e in spans:
                units.append(Unit("adversarial", a.attack, float(params.get("eps", 0.0)), js, "", s, e))
        if ctx.spec.indicators:  # + the unconstrained run of each attack family
            names = [a.attack for a in ctx.spec.attacks]
            units += evidence.unconstrained_units(ctx, [attack_settings(ctx, a) for a in ctx.spec.attacks], names)
        if getattr(ctx.spec, "converge", None) is not None:  # --converge: the ladder's units (benchmarks/converge.py)
            from .converge import converge_units

            units += converge_units(ctx)
        return units

    def batches(self, ctx: Any, unit: Unit) -> Iterator[AttackedBatch]:
        from ..probes.units import probe_batches  # --analyze: one hooked forward pass on each batch's final points

        return probe_batches(ctx, unit, attack_batches(ctx, unit))

    def records(self, ctx: Any, unit: Unit, b: AttackedBatch) -> Dict[str, Column]:
        y, c1, c5 = b.y, b.clean_correct_top1, b.clean_correct_top5
        rec: Dict[str, Column] = {"sample_id": b.sample_ids, "label": y, "clean_pred": b.clean_pred,
                                  "clean_correct_top1": c1, "clean_correct_top5": c5}
        if b.attack is None:
            return {**rec, "pred": b.clean_pred, "correct_top1": c1, "correct_top5": c5, "attacked": False}
        attack, adv_logits = b.attack, b.adv_logits
        a1, a5 = still_correct(adv_logits, y, 1), still_correct(adv_logits, y, 5)
        if attack.worst_case and not b.paper:
            a1, a5 = a1 & c1, a5 & c5
        delta = (b.x_adv - b.x).flatten(1)
        if unit.condition != UNCONSTRAINED:  # --save-adv: the points these verdicts were given on
            keep_adversarial(ctx, unit, b.sample_ids, b.x, b.x_adv, y, attack.norm, float(getattr(attack, "eps", 0.0)),
                             logits=adv_logits)
        return {**rec, "pred": adv_logits.argmax(1), "correct_top1": a1, "correct_top5": a5, "attacked": b.attacked,
                "grad_zero": b.grad_zero if attack.uses_gradients and b.grad_zero_known else None,
                "pert_linf": delta.abs().amax(1), "pert_l2": delta.norm(dim=1), "pert_l1": delta.abs().sum(1),
                **(b.evidence or {})}

    def passes(self, ctx: Any, unit: Unit) -> Tuple[float, float]:
        """The attack's passes plus two forward passes (clean and verdict); clean units: one."""
        if unit.attack == "clean":
            return 1.0, 0.0
        fwd, fb = make_attack(unit.attack, **json.loads(unit.params)).passes()
        return 2.0 + fwd, fb


