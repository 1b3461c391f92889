"""The exceptions zephon_torch raises: each subclasses the built-in a caller would expect."""

from __future__ import annotations


class ZephonError(Exception):
    """Base class of every zephon_torch error."""


class ConfigError(ZephonError, ValueError):
    """A setting is invalid: the message names the argument, the rule and the value."""


class StateMismatchError(ZephonError, ValueError):
    """A saved state does not fit the pipeline it is loaded into; lists every difference."""

    def __init__(self, mismatches: dict[str, tuple[object, object]]) -> None:
        self.mismatches = dict(mismatches)
        lines = "\n".join(
            f"  {key}: saved {saved!r}, live {live!r}" for key, (saved, live) in sorted(mismatches.items())
        )
        super().__init__(f"state does not match this pipeline in {len(mismatches)} setting(s):\n{lines}")


class DataError(ZephonError, ValueError):
    """Bad input data, with the dataset, shard and row where it was found."""

    def __init__(
        self, message: str, *, dataset: str, shard: str | None = None, row: int | None = None
    ) -> None:
        self.dataset = dataset
        self.shard = shard
        self.row = row
        where = f"dataset {dataset!r}"
        if shard is not None:
            where += f", shard {shard!r}"
        if row is not None:
            where += f", row {row}"
        super().__init__(f"{where}: {message}")


class StorageError(ZephonError, OSError):
    """Storage failed after retries; names the URL."""

    def __init__(self, message: str, *, url: str) -> None:
        self.url = url
        super().__init__(f"{url}: {message}")
