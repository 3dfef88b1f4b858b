"""The run machinery: options -> spec -> plan of work units -> the loop that computes them on a device.

Everything here may import torch. It writes per-sample records through ``robustbench_pid.results``
(run folders, unit files, merge); nothing under ``results`` imports from here.
"""
