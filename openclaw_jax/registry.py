"""Things registered by name with a decorator (losses, environments, personas), one lookup error style.

A leaf module: it stores what other modules register and imports nothing of ours. A name can also be
*declared* with the module that registers it (`declare`): it is known at once (the config validates
against it) and the module is imported on the first `get`, so that knowing the names costs nothing
(the environments' names without importing a GUI or a sandbox).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """`@registry.register("name")` on a class or factory; `registry.get("name")` finds it again.

    An unknown name is a `ValueError`: "unknown <what> 'y'; registered: (...)"."""

    def __init__(self, what: str):
        self.what = what
        self._table: dict[str, T] = {}
        self._declared: dict[str, str] = {}   # name -> the module whose import registers it

    def register(self, name: str, *, overwrite: bool = False) -> Callable[[T], T]:
        def decorate(obj: T) -> T:
            self.add(name, obj, overwrite=overwrite)
            return obj

        return decorate

    def add(self, name: str, obj: T, *, overwrite: bool = False) -> None:
        if name in self._table and not overwrite:
            raise ValueError(f"a {self.what} named {name!r} is already registered; pass overwrite=True to replace it")
        self._table[name] = obj

    def declare(self, name: str, module: str) -> None:
        """`name` is registered by importing `module` (dotted), which `get(name)` does first."""
        self._declared[name] = module

    def get(self, name: str) -> T:
        if name not in self._table and name in self._declared:
            importlib.import_module(self._declared[name])
            if name not in self._table:
                raise ValueError(f"{self._declared[name]} was declared to register the {self.what} {name!r} but "
                                 f"did not")
        if name not in self._table:
            raise ValueError(f"unknown {self.what} {name!r}; registered: {self.names()}")
        return self._table[name]

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(set(self._table) | set(self._declared)))

    def __contains__(self, name: Any) -> bool:
        return name in self._table or name in self._declared

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
