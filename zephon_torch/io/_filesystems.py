"""fsspec file systems as zephon_torch opens them: the user's storage options, plus the limits
a client lacks where its defaults would hold a run for minutes or for ever."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zephon_torch.errors import ConfigError, StorageError, secret_free, without_secrets

GCS_REQUEST_TIMEOUT_S = 60.0
# gcsfs tries each request up to 6 times itself, 1 to 32 s apart (about 60 s a request against
# a dead endpoint); ours try twice: once, and once more after 1-2 s, which still covers the
# failure gcsfs retries for a reason of its own (a token that expired in flight, a 401).
GCS_TRIES = 2
_AZURE_SCHEMES = ("az", "abfs", "abfss")


def open_filesystem(url: str, storage_options: Mapping[str, Any]) -> tuple[Any, str]:
    """``url``'s fsspec file system and path, made with ``storage_options`` plus limits the
    clients lack:

    - gcsfs waits for an answer with no time limit by default, so a store that takes the
      connection and never answers held the run for ever; gs:// gets a ``requests_timeout``
      of ``GCS_REQUEST_TIMEOUT_S`` for the connection and for each read of the answer, none
      for the whole request, unless one is given (see `_gcs_request_timeout`).
    - The Azure SDK retries a request that could not be sent (a refused, unreachable or timed
      out connection) 3 times after 15 s and more each, and adlfs passes no setting of it on:
      a wrong or dead endpoint took 162 s to a ``StorageError``. az:// leaves those retries to
      the ``RetryPolicy`` (about 16 s with its defaults); the SDK still retries a request
      sent (a broken answer, a 5xx) as it does. The file system is made for zephon_torch
      alone (``skip_instance_cache``, unless given), not fsspec's cached one that the user's
      own code may hold.
    - gcsfs tries each request 6 times itself, up to 32 s apart, before the ``RetryPolicy``
      sees the error: 67 s to a ``StorageError`` on a dead endpoint with 2 attempts of the
      policy's. gs:// gets a file system of its own (as az://) whose requests gcsfs tries
      ``GCS_TRIES`` times (see `_fewer_gcsfs_tries`).

    Raises:
        ImportError: the URL's back end is not installed, saying what to install.
        ConfigError: a malformed URL, an unknown storage option, credentials missing a field
            (gcsfs: KeyError 'refresh_token').
        StorageError: a file system that connects when made (ftp, sftp, hdfs; gcsfs checking
            a token) cannot connect.
    """
    import fsspec

    options = dict(storage_options)
    scheme = url.split("://", 1)[0]
    if scheme in ("gs", "gcs"):
        options.setdefault("requests_timeout", _gcs_request_timeout())
    if scheme in ("gs", "gcs", *_AZURE_SCHEMES):  # a client of its own, to set retries on
        options.setdefault("skip_instance_cache", True)
    try:
        fs, root = fsspec.core.url_to_fs(url, **options)
    except ImportError as error:
        raise ImportError(
            f"reading {url!r} needs its fsspec back end: {error}; for s3://, gs:// and az:// "
            "install 'zephon-torch[cloud]'"
        ) from error
    except (TypeError, ValueError, LookupError) as error:
        raise ConfigError(
            f"cannot open {url!r} (check its storage_options): {type(error).__name__}: "
            f"{without_secrets(str(error))}"
        ) from secret_free(error)
    except OSError as error:  # StorageError blanks the credentials its text may quote
        raise StorageError(
            f"cannot connect: {type(error).__name__}: {error}", url=url
        ) from secret_free(error)
    if scheme in _AZURE_SCHEMES:
        _no_connect_retries(fs)
        root = _kept_question_mark(url, root)
    if scheme in ("gs", "gcs"):
        _fewer_gcsfs_tries(fs)
    return fs, root


def _gcs_request_timeout() -> Any:
    """gcsfs's ``requests_timeout`` of no answer, or no bytes of one, for
    ``GCS_REQUEST_TIMEOUT_S``. gcsfs gives it to aiohttp, which takes a number for the whole
    request, a shard's download included: every attempt of a healthy download taking longer
    (1 GB at 16 MB/s) was cut at 60 s as a timeout, so the shard never read."""
    import aiohttp

    limit = GCS_REQUEST_TIMEOUT_S
    return aiohttp.ClientTimeout(total=None, sock_connect=limit, sock_read=limit)


def _kept_question_mark(url: str, root: str) -> str:
    """`root` with the "?" that ends `url`'s last name, which adlfs drops: it reads a path
    ending in "?" as a URL with an empty query, so `az://bucket/what?` was listed as
    `bucket/what` (nothing, or a folder `what` in its place). Followed by "/", the mark is kept
    (`what?/`, `what?/a.jsonl`), so such a root is given a "/": a folder, as a name ending in "?"
    can be on Azure only (adlfs drops the mark of an object's own name at every request)."""
    if url.rstrip("/").endswith("?") and not root.rstrip("/").endswith("?"):
        return root.rstrip("/") + "?/"
    return root


def _fewer_gcsfs_tries(fs: Any) -> None:
    """Make ``fs``'s requests tried ``GCS_TRIES`` times by gcsfs, not 6 (see
    `open_filesystem`). gcsfs fixes the count when its class is made, by decorating
    ``_request`` with ``retry_request(retries=6)``: this instance gets the undecorated method
    decorated again. A gcsfs without that shape (another version) is left as it is."""
    import sys
    import types

    retry_request = getattr(sys.modules.get("gcsfs.retry"), "retry_request", None)
    request = getattr(type(fs), "_request", None)
    undecorated = getattr(request, "__wrapped__", None)
    if retry_request is None or undecorated is None:
        return
    fs._request = types.MethodType(retry_request(retries=GCS_TRIES)(undecorated), fs)


def _no_connect_retries(fs: Any) -> None:
    """Set the Azure client's retries of requests never sent to 0 (see `open_filesystem`). Its
    retry policy is one object shared by every container and blob client it makes, read at
    each request; a client without one (another SDK version) is left as it is."""
    client = getattr(fs, "service_client", None)
    policy = getattr(getattr(client, "_config", None), "retry_policy", None)
    if policy is not None and hasattr(policy, "connect_retries"):
        policy.connect_retries = 0
