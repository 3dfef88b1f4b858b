"""AutoAttack and its components, built on the reference implementation (``pyautoattack``, the authors'
code) used as a library: the standard ensemble (``standard.py``), its parts as separate attacks (APGD-CE,
APGD-T, FAB-T) and the variants the convergence ladder adds (APGD with EOT, APGD with more restarts).
One folder because they share one wrapper (``_library.py``: seeding from the run's generator, the box,
pass counting); each module registers one attack, like every module of ``attacks/``."""
from ...registry import discover

discover(__name__)
