"""User-facing errors: the CLI prints their message (problem + fix) and exits non-zero."""


class UserError(Exception):
    """Bad input from the user: a clear message naming the problem and the fix."""


class CheckpointError(UserError):
    """A checkpoint that is missing, corrupt, unsafe to load, or does not fit the model."""
