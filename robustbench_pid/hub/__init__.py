"""Released checkpoints: the registry of published weights (released), verified downloads (download) and
the manifest of the embedded digits checkpoints (checkpoints). The loader plug-in is loaders/released.py."""
