"""Things registered by name with a decorator (environments, personas), one lookup error style.

A leaf module: it stores what other modules register and imports nothing of ours.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """`@registry.register("name")` on a class or factory; `registry.get("name")` finds it again.

    An unknown name is a `ValueError`: "unknown <what> 'y'; registered: (...)"."""

    def __init__(self, what: str):
        self.what = what
        self._table: dict[str, T] = {}

    def register(self, name: str, *, overwrite: bool = False) -> Callable[[T], T]:
        def decorate(obj: T) -> T:
            self.add(name, obj, overwrite=overwrite)
            return obj

        return decorate

    def add(self, name: str, obj: T, *, overwrite: bool = False) -> None:
        if name in self._table and not overwrite:
            raise ValueError(f"a {self.what} named {name!r} is already registered; pass overwrite=True to replace it")
        self._table[name] = obj

    def get(self, name: str) -> T:
        if name not in self._table:
            raise ValueError(f"unknown {self.what} {name!r}; registered: {self.names()}")
        return self._table[name]

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._table))

    def __contains__(self, name: Any) -> bool:
        return name in self._table

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
