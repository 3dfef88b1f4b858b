"""A run folder on disk: its files and checksums, work units, sidecars, the trace, merging shards and
writing output paths safely."""
