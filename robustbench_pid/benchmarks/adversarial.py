"""Clean accuracy and attacks, in the ``standard`` or ``paper`` protocol.

standard (the one to trust): the model takes [0, 1] pixels and normalizes inside; attacks work in
  pixel space and clip to [0, 1]; they use the true labels; eps is in pixel units. Samples whose
  clean top-5 is already wrong are not attacked (x itself lies in the eps-ball, so they are not
  robust at either top-1 or top-5); a sample counts as robust only if it is correct both clean
  and under attack (the worst case over the ball), as AutoAttack scores it. Random noise is not a
  worst case and is scored as plain accuracy on the noisy images.
paper: reproduces the PIDformer / RPC-attention evaluation code as it ran (cleverhans on the
  normalized tensor): attacks see the network without the normalization layer, perturb the
  normalized tensor with no clipping (eps in normalized units, so 3/255 there is ~0.8/255 in
  pixels for ImageNet std), use the model's own clean predictions as labels, run every sample,
  stop nothing early; accuracy is the plain accuracy of the perturbed tensor against the true
  labels.
"""
from __future__ import annotations

import json
from typing import Any, List

import pandas as pd
import torch

from ..attacks import make_attack
from ..device import attack_precision
from ..results import accuracy_rows
from . import Benchmark, Unit, benchmarks


def topk_correct(logits: torch.Tensor, y: torch.Tensor, k: int) -> torch.Tensor:
    k = min(k, logits.shape[1])
    return (logits.topk(k, dim=1).indices == y[:, None]).any(1)


def attack_settings(ctx: Any, spec: Any) -> dict:
    """The attack's full settings for this protocol (what goes into records and unit keys)."""
    attack = make_attack(spec.attack, **spec.params)
    if ctx.spec.protocol == "paper" and "early_stop" in attack.param_names():
        attack = attack.with_params(early_stop=False)
    return attack.params()


@benchmarks.register("adversarial")
class Adversarial(Benchmark):
    name = "adversarial"

    def plan(self, ctx: Any) -> List[Unit]:
        from ..runner import chunks

        units: List[Unit] = []
        spans = chunks(len(ctx.indices), ctx.spec.chunk_size)
        for s, e in spans:
            units.append(Unit("adversarial", "clean", 0.0, "{}", "", s, e))
        for a in ctx.spec.attacks:
            params = attack_settings(ctx, a)
            js = json.dumps(params, sort_keys=True)
            for s, e in spans:
                units.append(Unit("adversarial", a.attack, float(params.get("eps", 0.0)), js, "", s, e))
        return units

    def run_unit(self, ctx: Any, unit: Unit) -> pd.DataFrame:
        model = ctx.eval_model or ctx.model
        paper = ctx.spec.protocol == "paper"
        attack = None if unit.attack == "clean" else make_attack(unit.attack, **json.loads(unit.params))
        gen = ctx.generator(unit)
        rows: List[pd.DataFrame] = []
        for x, y, sids in ctx.batches(unit):
            with torch.inference_mode():
                clean_logits = model(x).float()
            clean_pred = clean_logits.argmax(1)
            c1, c5 = topk_correct(clean_logits, y, 1), topk_correct(clean_logits, y, 5)
            rec = {"sample_id": sids, "label": y.cpu().numpy(), "clean_pred": clean_pred.cpu().numpy(),
                   "clean_correct_top1": c1.cpu().numpy(), "clean_correct_top5": c5.cpu().numpy()}
            if attack is None:
                rec.update(pred=rec["clean_pred"], correct_top1=rec["clean_correct_top1"],
                           correct_top5=rec["clean_correct_top5"], attacked=False)
                rows.append(pd.DataFrame(rec))
                ctx.advance(len(y))
                continue
            grad_zero = torch.zeros(len(y), dtype=torch.bool)
            if paper:
                net = ctx.model.net
                z = ctx.model.normalize(x)
                with attack_precision(ctx.device, ctx.spec.precision):
                    z_adv = attack(net, z, clean_pred, bounds=None, generator=gen)
                x_adv_pixels = ctx.model.denormalize(z_adv)
                with torch.inference_mode():
                    adv_logits = net(z_adv).float()
                attacked = torch.ones(len(y), dtype=torch.bool)
                if "grad_zero" in attack.stats:
                    grad_zero = attack.stats["grad_zero"]
            else:
                attacked = c5.clone() if attack.worst_case else torch.ones_like(c5)
                x_adv = x.clone()
                sel = attacked.nonzero().squeeze(1)
                if len(sel):
                    with attack_precision(ctx.device, ctx.spec.precision):
                        x_adv[sel] = attack(ctx.model, x[sel], y[sel], bounds=(0.0, 1.0), generator=gen)
                    if "grad_zero" in attack.stats:
                        grad_zero[sel.cpu()] = attack.stats["grad_zero"]
                x_adv_pixels = x_adv
                with torch.inference_mode():
                    adv_logits = model(x_adv).float()
                attacked = attacked.cpu()
            a1, a5 = topk_correct(adv_logits, y, 1), topk_correct(adv_logits, y, 5)
            if attack.worst_case and not paper:
                a1, a5 = a1 & c1, a5 & c5
            delta = (x_adv_pixels - x).flatten(1)
            rec.update(pred=adv_logits.argmax(1).cpu().numpy(), correct_top1=a1.cpu().numpy(),
                       correct_top5=a5.cpu().numpy(), attacked=attacked.numpy(),
                       grad_zero=grad_zero.numpy() if attack.uses_gradients else None,
                       pert_linf=delta.abs().amax(1).cpu().numpy(),
                       pert_l2=delta.norm(dim=1).cpu().numpy(), pert_l1=delta.abs().sum(1).cpu().numpy())
            rows.append(pd.DataFrame(rec))
            ctx.advance(len(y))
        return pd.concat(rows, ignore_index=True)

    def summarize(self, records: pd.DataFrame) -> pd.DataFrame:
        return accuracy_rows(records, ("attack", "eps"))
