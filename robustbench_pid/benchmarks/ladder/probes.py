"""The convergence ladder's probes: cheap checks of the model that decide which rungs run and which status a
ladder may claim. Each answers one question about the model at the clean points, before any rung:

- ``passes_differ``: does a repeated forward pass disagree (a randomised model: the EOT rungs run)?
- ``batch_dependent``: does a sample's output change with the other samples in its batch (a batch statistic,
  BatchNorm left in training mode, or its position) by more than repeated passes of the same batch differ (a
  randomised model's noise is not batch dependence)? Then the rungs, which score verdicts on ever smaller subsets, could call a
  sample robust in one batch and broken in another: the ladder never says ``converged``;
- ``gradients_random`` / ``gradient_draws``: do two backward passes at the same input differ (a random gradient with
  a deterministic forward pass)? Then the EOT rungs, which average gradients over draws, run as for a randomised
  model; and where two draws agree less than they differ (cosine < 0.5), the gradient is mostly noise and the plain
  gradient rungs' failure is no evidence (gradient trust);
- ``gradients_unavailable``: are the input gradients of both the CE and the DLR loss zero or not finite
  (only the gradient-free rungs can attack such a sample; the number is an upper bound)?
- ``gradients_mislead``: does a tiny step along the gradient raise the loss more than the same step against it
  (where it does not, the gradient misleads, and the gradient families' failure is no evidence: the stop rule's
  gradient trust)?
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from ...attacks.base import dlr_losses


Grad = Optional[torch.Tensor]


def input_gradients(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> Tuple[Grad, Grad]:
    """The input gradients of the CE and of the DLR loss at x (None: the graph does not reach the input), from one
    forward and two backward passes: what :func:`gradients_unavailable` judges, and what the other gradient probes
    can take instead of passes of their own (design 8: the CE gradient is the first of :func:`gradient_draws`'s two
    draws, and in fp32 the DLR gradient is :func:`gradients_mislead`'s)."""
    x = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        logits = model(x).float()
        (g_ce,) = torch.autograd.grad(F.cross_entropy(logits, y, reduction="none").sum(), x, retain_graph=True,
                                      allow_unused=True)
        (g_dlr,) = torch.autograd.grad(dlr_losses(logits, y).sum(), x, allow_unused=True)
    return g_ce, g_dlr


def unavailable(g_ce: Grad, g_dlr: Grad, n: int, device: torch.device) -> torch.Tensor:
    """Per sample: are both gradients (:func:`input_gradients`) zero or not finite?"""
    return _bad(g_ce, n, device) & _bad(g_dlr, n, device)


def gradients_unavailable(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per sample: are the input gradients of both the CE and the DLR loss zero or not finite at x?
    One forward and two backward passes. CE alone would call a model with scaled-up logits gradient-free."""
    return unavailable(*input_gradients(model, x, y), len(x), x.device)


def _bad(g: Optional[torch.Tensor], n: int, device: torch.device) -> torch.Tensor:
    if g is None:
        return torch.ones(n, dtype=torch.bool, device=device)
    g = g.flatten(1)
    return ~(g.abs().amax(1) > 0) | ~torch.isfinite(g).all(1)


# repeated clean logits (or input gradients) differing by more than this share of their scale: random (fp32 and
# bf16 repeat to far less); a sample's logits alone vs in its batch differing by more (beyond the noise): batch-dependent
UNSTABLE_RTOL, BATCH_RTOL = 1e-3, 1e-2
PROBE_STEP = 2.0 ** -14  # L-inf pixels (about 6e-5): small enough that the model is linear at its scale


def gradients_mislead(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, step: float = PROBE_STEP,
                      grad: Grad = None) -> torch.Tensor:
    """Per sample: does a step of ``step`` (L-inf) along the sign of the DLR loss's input gradient (the scale-free
    loss the targeted family ascends) raise that loss no more than the same step against it? Then the gradient
    points downhill or nowhere (sign-flipped, or noise), and the gradient attacks' failure is no evidence.

    Why opposite steps: their difference is ``2 * step * ||g||_1`` to first order on a healthy model and the
    curvature terms cancel. Why a tiny step and not eps/4: on the zoo's transformers a step of eps/4 already leaves
    the linear regime (at 4/255 it flagged 71 of 356 clean-correct digits of the plain DeiT, 1 at eps/64 and none at
    2^-14 pixels, while flagging 285, 355 and 356 of its sign-flipped twin). In fp32 whatever ``--precision`` says:
    bf16 rounds a loss of about 1 to 2^-8, more than the first-order difference. A sample without a usable gradient
    is not flagged here (``gradients_unavailable`` speaks for it). One forward and one backward pass, and two
    forward passes; ``grad``: that DLR gradient at x where the caller already has it in fp32 (then only the two)."""
    x = x.detach().float().clone().requires_grad_(True)
    g = grad
    if g is None:
        with torch.enable_grad():
            logits = model(x).float()
            (g,) = torch.autograd.grad(dlr_losses(logits, y).sum(), x, allow_unused=True)
    if g is None:
        return torch.zeros(len(x), dtype=torch.bool, device=x.device)
    usable = ~_bad(g, len(x), x.device)
    d = torch.nan_to_num(g.detach(), nan=0.0, posinf=0.0, neginf=0.0).sign() * step
    x0 = x.detach()
    with torch.no_grad():
        up = dlr_losses(model((x0 + d).clamp(0, 1)).float(), y)
        down = dlr_losses(model((x0 - d).clamp(0, 1)).float(), y)
    return usable & ~(up > down)


def passes_differ(again: torch.Tensor, logits: torch.Tensor, rtol: float) -> bool:
    """Does a repeated pass's ``again`` disagree with ``logits`` (argmax, or beyond ``rtol`` of their scale)? A
    randomised model (dropout left on, random transforms) needs expectation over transformation."""
    if not len(logits):
        return False
    scale = float(logits.abs().max()) + 1e-12
    return bool((again.argmax(1) != logits.argmax(1)).any()) or float((again - logits).abs().max()) > rtol * scale


NOISE_FACTOR = 3.0  # batch dependence must exceed this many times what repeated passes of the batch differ by


def batch_probe_rows(n: int, probes: int = 4) -> Tuple[int, int]:
    """(samples :func:`batch_dependent` scores alone, samples it scores in another company) for a batch of ``n``:
    its forward passes beyond the batch's repeated pass."""
    if n < 2:
        return 0, 0
    return min(int(probes), n), min(2 * int(probes), n)


def batch_dependent(model: torch.nn.Module, x: torch.Tensor, logits: torch.Tensor, rtol: float, probes: int = 4,
                    again: Optional[torch.Tensor] = None) -> bool:
    """Do the logits of a few samples scored alone (batches of one), and of the first ``2 * probes`` in another
    company (those alone as a batch, in reverse order), differ from their logits in the batch they were scored in
    (``logits``) beyond ``rtol`` of the logits' scale plus ``NOISE_FACTOR`` times what the same batch differs by
    when passed again? ``probes`` + ``2 * probes`` forward passes (:func:`batch_probe_rows`). Kernels for other
    batch sizes round differently (about 1e-6 of the scale in fp32, 1e-3 in bf16), so ``rtol`` sits well above
    rounding and far below what a batch statistic does (the whole scale). Why a small reversed batch (design 8; the
    whole batch reversed before): it is both another company (a batch statistic over 8 samples is not the one over
    the batch; a whole batch reversed has the same mean) and another order, for a tenth of the passes. Why the
    repeated pass: on a randomised model (input noise at every pass) every pass differs, in any company; only a
    difference beyond that noise is the batch's doing (both maxima are over draws of one noise, so 3x is far above
    their spread). ``again``: the batch's repeated pass where the caller already made it (the instability probe's),
    which saves one pass of the batch. A batch of one sample cannot show a dependence: False."""
    k, m = batch_probe_rows(len(x), probes)
    if not m:
        return False
    scale = float(logits.abs().max()) + 1e-12
    with torch.no_grad():
        again = model(x).float() if again is None else again.float()
        alone = torch.cat([model(x[i:i + 1]).float() for i in range(k)])
        company = model(x[:m].flip(0)).float().flip(0)
    if not bool(torch.isfinite(again).all()):
        return True
    noise = float((again - logits.float()).abs().max())
    for got, want in ((alone, logits[:k]), (company, logits[:m])):
        if not bool(torch.isfinite(got).all()) or \
                float((got - want.float()).abs().max()) > rtol * scale + NOISE_FACTOR * noise:
            return True
    return False


NOISE_COSINE = 0.5  # two draws of a gradient agreeing less than this: its noise is at least as large as its signal


def gradients_random(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, rtol: float) -> bool:
    """Do two input gradients of the CE loss at the same points differ beyond ``rtol`` of their scale (a random
    backward pass: noise injected into the gradient, a stochastic surrogate)? Two forward and two backward passes.
    A deterministic model's two gradients agree to rounding (the same kernels on the same inputs)."""
    return gradient_draws(model, x, y, rtol)[0]


def gradient_draws(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, rtol: float, first: Grad = None
                   ) -> Tuple[bool, torch.Tensor]:
    """Two input gradients of the CE loss at the same points: (do they differ beyond ``rtol`` of their scale, the
    cosine between the two draws per sample). For draws g + n1 and g + n2 of independent noise the cosine is about
    ||g||^2 / (||g||^2 + ||n||^2): below ``NOISE_COSINE`` (0.5) the noise is at least as large as the gradient, and a
    gradient attack stepping on one draw at a time walks mostly at random, so its failure is no evidence (the EOT
    rungs average 20 draws; the plain rungs do not). A deterministic model's cosine is 1. Samples without a usable
    gradient get cosine 1 (``gradients_unavailable`` speaks for them). Two forward and two backward passes, one of
    each where ``first`` is a draw the caller already made (the CE gradient of :func:`input_gradients`, in the same
    precision)."""
    ones = torch.ones(len(x), device=x.device)
    if not len(x):
        return False, ones
    grads = []
    for i in range(2):
        g = first if i == 0 else None
        if g is None:
            xi = x.detach().clone().requires_grad_(True)
            with torch.enable_grad():
                (g,) = torch.autograd.grad(F.cross_entropy(model(xi).float(), y, reduction="sum"), xi,
                                           allow_unused=True)
        if g is None:
            return False, ones
        grads.append(torch.nan_to_num(g.detach().float().flatten(1), nan=0.0, posinf=0.0, neginf=0.0))
    a, b = grads
    scale = float(a.abs().max()) + 1e-30
    usable = (a.abs().amax(1) > 0) & (b.abs().amax(1) > 0)
    cos = torch.where(usable, F.cosine_similarity(a, b, dim=1), ones)
    return float((a - b).abs().max()) > rtol * scale, cos
