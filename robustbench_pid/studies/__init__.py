"""A study in one home: the spec and its TOML files (spec), running it (reproduce), its dry run (dryrun) and
its table with the paper beside it (table, torch-free)."""
