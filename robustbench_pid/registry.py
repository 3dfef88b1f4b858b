"""One tiny registry type shared by every extension point (models, loaders, attacks, datasets, ...).

Adding an extension means adding one module that registers itself; ``discover`` imports every
module of a package so nothing else has to be edited.
"""
from __future__ import annotations

import difflib
import importlib
import pkgutil
from typing import Callable, Dict, Generic, Iterator, List, Optional, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """An unknown name; the message lists the valid ones (and a close match when there is one)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Registry(Generic[T]):
    """Name -> object. With ``package``, the package's modules are imported (and so register
    themselves) the first time the registry is read, not when it is created."""

    def __init__(self, kind: str, package: Optional[str] = None) -> None:
        self.kind = kind
        self._items: Dict[str, T] = {}
        self._package = package

    def _load(self) -> None:
        if self._package is not None:
            package, self._package = self._package, None  # first: modules may read the registry
            discover(package)

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return deco

    def add(self, name: str, obj: T) -> T:
        return self.register(name)(obj)

    def get(self, name: str) -> T:
        self._load()
        try:
            return self._items[name]
        except KeyError:
            close = difflib.get_close_matches(name, self._items, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}.{hint} Valid {self.kind}s: {', '.join(self.names())}"
            ) from None

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._items

    def names(self) -> List[str]:
        self._load()
        return sorted(self._items)

    def items(self) -> Iterator[tuple]:
        self._load()
        return iter(sorted(self._items.items()))


def discover(package_name: str) -> None:
    """Import every submodule of ``package_name`` so their registrations run."""
    pkg = importlib.import_module(package_name)
    for mod in pkgutil.iter_modules(pkg.__path__):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{package_name}.{mod.name}")
