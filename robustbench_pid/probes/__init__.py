"""Probes: what a model computes inside, read with forward hooks during an evaluation (torch side).

``attention``: per-layer metrics of the token matrix and the attention on clean and attacked inputs
(``evaluate --analyze attention``); the pure metric functions are in ``metrics``.
"""
