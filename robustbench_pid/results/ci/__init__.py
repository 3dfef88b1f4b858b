"""Regression checks for CI: check against a committed baseline, and writing that baseline."""
