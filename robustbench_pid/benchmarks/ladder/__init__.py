"""The convergence ladder: attack the samples still robust with four attack families that fail in different ways,
and say which kind of number came out. The stop rule (docs/attacks.md carries the same text between its
``stop-rule`` markers; ``tests/test_stop_rule.py`` has a test per sentence):

Round 1 runs APGD-T 12 iterations x 9 targets, APGD-CE 100, Square 500 queries on every still-robust sample. A
sample is near at tau (first 1/16) for the gradient families when one left at most tau of its clean margin; for
Square when it did or came nearer, everywhere once nearer on more samples than the tolerance. Later rounds give near
samples each family's AutoAttack budget once: APGD-T, FAB-T 9 targets x 100, Square continued to 5,000 queries.
While the last round broke over the tolerance, 0.1% of n, tau doubles, to every sample. Then edge samples, within
1/64 of their clean margin for the gradient families or Square, get those budgets afresh, up to 6 times. Converged:
the last near round broke at most the tolerance and every owed budget ran. Beyond the tolerance: unusable gradients
or a flagging probe, an upper bound; random or batch-dependent outputs, not converged.

Why families and not one strong attack: each has a blind spot another covers. Cross-entropy APGD saturates on
scaled-up logits; the targeted DLR margin (APGD-T) does not; FAB-T linearises the model instead of ascending a loss;
Square needs no gradient, so a model whose gradients point the wrong way fools the first three but not it. Why the
full budget only where a family came near: the samples a stronger attack still breaks are those a weaker one brought
closest (A^3, Liu et al. 2022), and the widening makes tau's start a question of cost, not of correctness: a round
that still breaks more than the tolerance widens the set. Why Square everywhere on a model where it is the nearer
search on more samples than the tolerance: there no margin, the gradient families' or its own 500 queries', ranks
where its 5,000 break, so it gets them wherever AutoAttack's Square would. Why fresh starts on the edge: a sample
one start left a hair from the boundary is decided by that start's last steps, so another start (AutoAttack's later
attacks are such starts) may cross where the first did not; what they break is luck, not a sign that tau is too
narrow, so it neither widens tau nor counts as the last round. Why 6: with s equally strong starts, the chance that
AutoAttack's one start crosses where all of them missed, p (1 - p)^s, is at most s^s / (s + 1)^(s + 1), first below
0.05 at s = 7, the full budget's run and 6 fresh ones (``stop_rule.FRESH``). Its promise: wherever an attack of a kind
came within tau of the boundary, every family of that kind spent at least AutoAttack's budget (Square on every
sample where it is the nearer search), and wherever one came within the edge, every family of that kind spent it 7
times, 6 from fresh starts, or until one broke the sample.

Rung 0 is the user's attack, read from its row (``rung0``). The rule's verdict is one pure function of a per-sample
evidence table, ``results/summaries/stop_rule.py``, applied per work unit and per condition.

Modules: ``spec`` (settings), ``rung0`` (rung 0), ``rungs`` (running one rung), ``families`` (each family's round-1
run, full budget and continuation), ``state`` (the per-sample evidence), ``stop`` (the rounds), ``probes`` (the
checks of the model before any rung).
"""
from __future__ import annotations

from ...results.summaries.converge import DESIGN, rung_id  # noqa: F401
from ...results.summaries.stop_rule import (BATCH_DEPENDENT, CONVERGED, MISLED, NOT_CONVERGED,  # noqa: F401
                                            RANDOM_OUTPUTS, REDUCED, UPPER_BOUND)
from .families import FAMILIES, planned_round  # noqa: F401
from .rungs import Rung, RungResult, finite_or_stop, run_rung  # noqa: F401
from .spec import MAX_TOL_MIN, MAX_TOL_SHARE, LadderSpec  # noqa: F401
from .state import Ladder  # noqa: F401
from .stop import climb  # noqa: F401

PROBE = "probe"  # passes spent on the instability, batch-context and gradient probes
