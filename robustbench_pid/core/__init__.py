"""Pure-python names every layer shares, no torch: the version, eps labels, where shipped files live and
the ImageNet class lists (with the project's ImageNet-O list in _data/)."""
