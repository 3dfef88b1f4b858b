"""Only what pyproject.toml cannot say: every subpackage is found (a new plug-in folder needs no edit here),
and the top-level data folders travel inside the wheel: attacks/ as robustbench_pid/attack_suites and
checkpoints/ as robustbench_pid/embedded_checkpoints (robustbench_pid/core/shipped.py finds either location).
pyproject's static ``packages`` list cannot be combined with package discovery, hence this file."""
from setuptools import find_packages, setup

DATA_FOLDERS = {"robustbench_pid.attack_suites": "attacks", "robustbench_pid.embedded_checkpoints": "checkpoints"}

setup(packages=find_packages(include=["robustbench_pid", "robustbench_pid.*"]) + list(DATA_FOLDERS),
      package_dir=DATA_FOLDERS)
