"""Torch helpers shared by the benchmarks and the run machinery: device and precision choice, how this
process was launched (shards, local GPU) and the non-finite checks."""
