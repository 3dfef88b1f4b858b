"""Data made on the fly rather than read: the ImageNet-C corruption generator and the synthetic JPEG tree
that doctor and scripts/ time decoding on. A subpackage so dataset discovery does not import them (cv2, scipy)."""
