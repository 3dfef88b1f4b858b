"""Results that travel: a run's adversarial images as tensors, and its RobustBench entry (model_info JSON, the
adversarial tensor, the unaggregated corruption CSV). Built on finished runs; the files they read are verified
against the sha256 recorded in the run's run.json."""
