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


def register_l2(cls: Type[Attack], name: str, label: str, doc: str = "", **members: Any) -> Type[Attack]:
    """Register ``cls``'s form in the L2 threat model as ``name``: the same settings, checks and library calls
    (which read ``self.norm``), with L2's eps default (0.5: RobustBench's CIFAR-10 L2 budget) and no eps bound of
    1. One subclass made here rather than written out per attack, so every L2 form is made the same way."""
    from dataclasses import dataclass

    ns = {"__module__": cls.__module__, "__qualname__": f"{cls.__name__}L2",
          "__doc__": doc or f"{cls.__name__} in the L2 threat model (``norm = 'l2'``).",
          "__annotations__": {"eps": float},
          "name": name, "norm": "l2", "eps_max": float("inf"), "label": label, "eps": 0.5, **members}
    return attacks.register(name)(dataclass(type(f"{cls.__name__}L2", (cls,), ns)))


__all__ = ["Attack", "attacks", "get_attack", "make_attack", "attack_names", "register_l2"]
