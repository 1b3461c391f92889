"""Readers that pickle as their settings: a DataLoader worker or a spawned runner process gets
the settings alone and makes the reader's open files and caches again on first use."""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

R = TypeVar("R", bound="PickledAsSettings")


class PickledAsSettings:
    """Pickles as the attributes named in ``SETTINGS``; unpickled, ``_open_caches`` makes the
    rest (open files, caches, what is read from an index) again."""

    SETTINGS: ClassVar[tuple[str, ...]] = ()

    def _open_caches(self) -> None:
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        return {key: self.__dict__[key] for key in self.SETTINGS}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open_caches()

    def with_settings(self: R, **changes: Any) -> R:
        """A reader of the same data with ``changes`` to its settings, its caches empty."""
        unknown = set(changes) - set(self.SETTINGS)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no settings {sorted(unknown)}")
        clone = type(self).__new__(type(self))
        clone.__setstate__({**self.__getstate__(), **changes})
        return clone
