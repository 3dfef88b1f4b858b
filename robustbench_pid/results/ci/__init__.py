"""Regression checks for CI: check against a committed baseline (``check``), the comparison rules behind its
statuses (``compare``), and writing that baseline (``baseline``)."""
