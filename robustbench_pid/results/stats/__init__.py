"""Statistics as small pure functions: Wilson intervals, mCE, OOD metrics, paired tests and bootstraps."""
