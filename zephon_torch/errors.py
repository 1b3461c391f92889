"""The exceptions zephon_torch raises: each subclasses the built-in a caller would expect."""

from __future__ import annotations

from typing import Any


class ZephonError(Exception):
    """Base class of every zephon_torch error."""


class ConfigError(ZephonError, ValueError):
    """A setting is invalid: the message names the argument, the rule and the value."""


class StateMismatchError(ZephonError, ValueError):
    """A saved state does not fit the pipeline it is loaded into; lists every difference."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (StateMismatchError, (self.mismatches,))

    def __init__(self, mismatches: dict[str, tuple[object, object]]) -> None:
        self.mismatches = dict(mismatches)
        lines = "\n".join(
            f"  {key}: saved {saved!r}, live {live!r}"
            for key, (saved, live) in sorted(mismatches.items())
        )
        super().__init__(
            f"state does not match this pipeline in {len(mismatches)} setting(s):\n{lines}"
        )


class DataError(ZephonError, ValueError):
    """Bad input data, with the dataset, shard and row where it was found.

    The library always names the dataset. The fields may be left out only so that torch, which
    re-raises a DataLoader worker's error as ``type(error)(message)``, keeps its type (the
    message still says where; ``zephon_torch.torch.DataLoader`` passes the fields too).
    """

    def __init__(
        self,
        message: str,
        *,
        dataset: str | None = None,
        shard: str | None = None,
        row: int | None = None,
    ) -> None:
        self.dataset = dataset
        self.shard = shard
        self.row = row
        where = [] if dataset is None else [f"dataset {dataset!r}"]
        if shard is not None:
            where.append(f"shard {shard!r}")
        if row is not None:
            where.append(f"row {row}")
        self.detail = message
        super().__init__(f"{', '.join(where)}: {message}" if where else message)

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only fields survive the trip back from a worker process.
        return (_rebuild_data_error, (self.detail, self.dataset, self.shard, self.row))


class StorageError(ZephonError, OSError):
    """Storage failed after retries; names the URL (left out only as for ``DataError``)."""

    def __init__(self, message: str, *, url: str | None = None) -> None:
        self.url = url
        self.detail = message
        super().__init__(message if url is None else f"{url}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (StorageError._rebuild, (self.detail, self.url))

    @staticmethod
    def _rebuild(message: str, url: str | None) -> StorageError:
        return StorageError(message, url=url)


def _rebuild_data_error(
    message: str, dataset: str | None, shard: str | None, row: int | None
) -> DataError:
    return DataError(message, dataset=dataset, shard=shard, row=row)
