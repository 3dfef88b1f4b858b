"""The convergence ladder: attack the samples still robust with attack families that fail in different ways,
in rounds, until a round breaks (almost) nothing more, and say which kind of number came out.

Why families and not one strong attack: each family has a blind spot another covers. Cross-entropy APGD
saturates on scaled-up logits; the targeted DLR margin (APGD-T) does not, and reaches classes the untargeted
ascent walks past; a minimum-norm boundary search (FAB-T) linearises the model instead of ascending a loss;
a gradient-free random search (Square) needs no gradient at all, so a model whose gradients point the wrong
way (obfuscated, noisy, sign-flipped) fools the first three but not it. A ``converged`` resting on gradient
attacks alone was wrong on the first adversarially trained model it met (Square broke what APGD-T left).

Rounds (``planned_round``), each rung on the samples still robust after the rungs before it:
- rung 0 (``user``, ``rung0.py``): the user's attack(s), read from their rows (design 9): the row's top-1 verdicts
  on the clean top-1 correct samples, and the first top-1 break its walk noted where the final point no longer
  shows it (the row walks on to break top-5; rung 0 breaks every sample the row breaks at top-1, and any whose walk
  crossed the boundary and came back), with no walk of its own;
- round 1, on every still-robust sample: [EOT rungs when repeated clean passes disagree], a sweep of APGD-T
  over all ``pool`` candidate classes in the order of their linearised boundary distance (MALT's ranking;
  AutoAttack attacks the 9 highest logits for 100 iterations each) with only ``sweep_steps`` iterations per
  target, APGD-CE, FAB-T, Square with a small budget, [SPSA on samples without gradients]. Why a short sweep
  and not two deep targets: on the zoo the class a sample breaks to is often ranked 3rd to 6th, and a
  12-iteration run per class found every AutoAttack break at half the passes of two 100-iteration ones, which
  missed those ranks (docs/attacks.md). Why the targeted family first: it leaves a sample at its first break,
  while APGD-CE spends its 100 iterations on every sample it attacks, broken early or not; the samples the
  sweep breaks cost APGD-CE nothing;
- round r >= 2, only if the round before broke more than the tolerance: the same four families with a
  fresh start and a larger budget (``targets`` ranked classes at the full ``steps`` each, the next ones in
  each later round; the next FAB target; Square continuing each sample's search from its best point to
  ``square_growth`` times the queries it had done, design 7: one search paused for the stop rule to look, not
  fresh runs that repeat the large early squares). APGD-T and APGD-CE go to
  the still-robust samples nearest the boundary: the ``near_share`` with the least of their clean verdict margin
  left by any gradient family (A^3's observation that the samples a stronger attack still breaks are those a
  weaker one brought closest). The search families (FAB-T, Square) go back only where they were still closing in
  (exhaustion, below), and to their own nearest only after a round in which they broke a sample (design 6: on the
  grid neither broke a sample after round 1, and their runs on the nearest were most of the forward passes on the
  adversarially trained CNN). Each family is judged by its own kind of evidence, because a model can fool the
  gradient attacks, whose margins then say nothing about where a gradient-free search will break it. Square's later
  runs also take every sample on which its short round-1 search came at least as near the boundary as the
  gradient families (``Ladder.misled``): on a healthy model 100 gradient iterations get much nearer than 500
  random queries, so such a sample is one whose gradients mislead, and there the gradient-free search is the
  only evidence (on a model with sign-flipped gradients, the samples only Square breaks are such samples, and
  their Square margin after 500 queries need not be among the nearest).

Exhaustion (design 5): "a round broke nothing" is no evidence while a search is visibly closing in (an
adversarially trained CNN from elsewhere: Square's best margin on two samples fell from 0.62 / 0.90 to 0.04 /
0.14 between 500 and 1,000 queries, where the ladder stopped it; both break at 2,000). So every family's run
reports, per sample, the lowest verdict margin ``z_y - max_{j != y} z_j`` at the points it tried inside the ball
and what the last half of its passes on that sample still gained (``attacks/telemetry.py`` ``Counted.progress``:
every point a library loop tries goes through the counted model). A family is still closing in on a sample when
the margin left is at most ``lookahead`` (4) times what that last half gained over the lowest margin the family
had reached before it (in earlier runs, or this run's first half: a fresh restart always gains early in its own
run, so its own first half alone would call every restart closing in): at the pace of its last half, a run of twice the
budget would cross. Why one step ahead and not to the cap: searches slow down (Square's squares shrink, APGD's
step halves), so a straight line to a 5,000-query cap would call almost every sample still improving, while one
doubling is where the measured pace is a fair guess, and the next run is judged again. Such a sample gets that
family again (in a later full round, or a continuation round that runs only the families still closing in) until
it breaks, the family stalls, or the family's cap per sample is spent (AutoAttack's budgets: Square 5,000 queries,
APGD-T 9 x 100, FAB-T 9 x 100 backward passes; APGD-CE three runs of 100). Still closing in at the cap, or when
the rounds run out, on more than the tolerance of the samples: ``not converged``.

Gradient trust: where a step along the input gradient of the DLR loss raises it no more than the same step against
it (``probes.gradient_probe``: a sign-flipped gradient fails it), where the random search came strictly nearer the
boundary than every gradient rung on a sample (the same verdict margin, the same sample), or where the gradient
rungs never got nearer than the clean point, the
gradient families' failure is no evidence; on more than the tolerance of the samples left robust the status is
``upper bound: gradients mislead``, whatever the search found (a finite random search proves no sample robust).
Not applied to a randomised forward pass: there a margin and a verdict are one random draw, the EOT rungs run and
the status is ``not converged: outputs are random`` (a random quantity has no converged value). Gradients that differ between two backward passes at one input are random: the EOT rungs run.

Measured targets and near misses (design 6): the deep APGD-T runs attack the classes in the order of how near round
1's sweep came on each (the measured distance; the linearised ranking only estimated it: on deit 5/255 the sweep
came to a margin of 0.10 on a class ranked 4th, the deep run attacked ranks 1-3, and AutoAttack broke the sample on
that class); a sample the targeted family is still closing in on gets a fresh start on the classes it came nearest
on, not the next ranks; the nearest samples are those with the least of their clean verdict margin left by any
gradient family (design 5 ranked by APGD-T's DLR loss alone, so a sample APGD-CE had brought to 0.005 never had a
deep run); and a gradient search that stalled with at most ``near_miss`` (10%) of the clean margin left has not
shown the sample robust (another start lands on either side), so the targeted family gives it ``near_tries`` (1)
fresh start on the class it came nearest on (design 7; design 6 went on to the cap, three classes a round, which
was a large share of cnn_at 64/255's forward passes, and only the first extra start ever broke a sample); a start that
is still gaining makes the sample one the family is closing in on, which goes on to the cap. A near miss on the
boundary's edge (at most ``edge``, 1%, of the clean margin left) gets ``edge_tries`` (6) more starts on that class,
three a round and past the cap (design 10): there another start may land on either side, so a stall is no
evidence (cnn_at 48/255, design 9's draw: left robust after its starts there, broken by AutoAttack's).

Stop rule: a full round in which every family had its turn and which broke at most ``tolerance(n)`` =
max(tol_min, floor(tol_share * n)) samples, with every family stalled on every sample left robust (all but the
tolerance), ends the ladder ``converged``; a full round after ``rounds`` is never run, so a third that still breaks
more is ``not converged``. More than the tolerance of still-robust samples without usable input gradients makes
it ``upper bound: gradients unavailable`` whatever the rounds broke; a model whose outputs depend on the
batch (beyond what repeated passes of the same batch differ by) is ``not converged: outputs depend on the batch``.
A ladder with settings below the defaults (fewer steps, targets, queries, rounds, caps, or a looser tolerance) says
so: ``converged (reduced ladder: ...)``. The rule is applied per work unit (so sharding never changes a verdict)
and once more per condition (``results/summaries/converge.py``).

Modules: ``spec`` (settings), ``rung0`` (rung 0, read from the user's row), ``rungs`` (what a round runs, running
one rung), ``state`` (the per-sample evidence), ``stop`` (rounds and the stop rule), ``probes`` (the checks of the
model before any rung).
"""
from __future__ import annotations

from ...results.summaries.converge import (BATCH_DEPENDENT, CONVERGED, DESIGN, MISLED, NOT_CONVERGED,  # noqa: F401
                                           RANDOM_OUTPUTS, REDUCED, UPPER_BOUND, rung_id)
from .rungs import FAMILIES, Rung, RungResult, finite_or_stop, planned_round, run_rung  # noqa: F401
from .spec import MAX_TOL_MIN, MAX_TOL_SHARE, LadderSpec  # noqa: F401
from .state import Ladder  # noqa: F401
from .stop import Round, climb, verdict  # noqa: F401

PROBE = "probe"  # passes spent on the instability, batch-context and gradient probes
