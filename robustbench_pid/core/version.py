"""The package version, in its own module so the modules that record it never import the package root."""
__version__ = "0.1.0"  # keep equal to pyproject.toml's [project] version (tests/test_architecture.py checks)
