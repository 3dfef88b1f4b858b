"""The result side: per-sample records -> tidy summaries, tables, comparisons, plots, reports, CI checks,
and the run folder's files (units, merge, integrity).

Its boundary is the torch boundary: no module under this folder imports torch, timm or the run
machinery (``tests/test_architecture.py`` checks the folder), so ``table``, ``check``, ``plot``,
``report`` and ``merge`` start in a fraction of a second and run where torch is not installed.
"""
