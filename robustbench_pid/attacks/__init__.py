"""Attacks: one module each, one small interface ``attack(model, x, y) -> x_adv``.

Every attack is a dataclass whose fields are its settings (so suites, the CLI and provenance all
read the same names), registered under its name. Adding an attack means adding one module.
"""
from __future__ import annotations

from typing import Any, Type

from ..registry import Registry
from .base import Attack

attacks: Registry[Type[Attack]] = Registry("attack", package=__name__)


def get_attack(name: str) -> Type[Attack]:
    return attacks.get(name)


def make_attack(name: str, **params: Any) -> Attack:
    """Build an attack from its name and settings; unknown settings are refused by name."""
    cls = get_attack(name)
    return cls.from_params(params)


def attack_names() -> list:
    return attacks.names()


__all__ = ["Attack", "attacks", "get_attack", "make_attack", "attack_names"]
