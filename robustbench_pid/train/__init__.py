"""Training the embedded digits models: pinned recipes (``recipes``) and the loop (``loop``)."""
from __future__ import annotations

from .loop import train
from .recipes import FAMILIES, Recipe, embedded_name, family_of, recipe_for, trainable

__all__ = ["FAMILIES", "Recipe", "embedded_name", "family_of", "recipe_for", "train", "trainable"]
