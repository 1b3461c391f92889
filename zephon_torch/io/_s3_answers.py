"""The ETags that S3 answered a download's GETs with: where each answer names the listed
version, the bytes are that version's, and `_download.fetch` needs no HEAD after the download
to ask whether the object is still as listed (about 2.5 ms of CPU an object with s3fs on
loopback, as much as the transfer of 1.5 MB, and a round trip each).

s3fs does not pass on a GET's answer headers, so its client's `after-call` event records them,
for the downloads that run inside `recording` alone (a context variable tells them apart from
the client's other calls, in this thread or others). A download made another way, by a client
that s3fs made again (a session refreshed) or on another file system, records nothing, and is
checked by a HEAD as before.
"""

from __future__ import annotations

import contextvars
from collections.abc import Coroutine
from typing import Any

_ANSWERS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "zephon_s3_get_answers", default=None
)
_HOOK = "zephon-torch-get-etags"  # registered once a client


def is_s3(fs: Any) -> bool:
    """Whether `fs` is s3fs's file system (whose GETs `recording` can record)."""
    return type(fs).__name__ == "S3FileSystem" and hasattr(fs, "get_s3")


async def recording(
    fs: Any, bucket: str, work: Coroutine[Any, Any, Any], answers: list[str]
) -> Any:
    """Awaits `work`, a download from `bucket` on s3fs's `fs`, appending to `answers` the ETag
    of each successful GET it makes (one a part of a download in parts; "" where an answer
    has none). Where the client cannot be hooked, `work` runs all the same and nothing is
    recorded."""
    token = _ANSWERS.set(answers)
    try:
        try:
            await _hook(fs, bucket)
        except Exception:  # the download itself raises what is wrong with the client
            pass
        except BaseException:  # cancelled before the download began
            work.close()
            raise
        return await work
    finally:
        _ANSWERS.reset(token)


async def _hook(fs: Any, bucket: str) -> None:
    """Registers `_record` on the client that `bucket`'s calls on `fs` go to (once)."""
    await fs.set_session()
    s3 = await fs.get_s3(bucket)
    s3.meta.events.register("after-call.s3.GetObject", _record, unique_id=_HOOK)


def _record(http_response: Any = None, parsed: Any = None, **_: Any) -> None:
    """The client's `after-call` handler of a GetObject: records its ETag for the download
    under way in this context, if any."""
    answers = _ANSWERS.get()
    if answers is None or http_response is None or http_response.status_code >= 300:
        return
    etag = parsed.get("ETag") if isinstance(parsed, dict) else None
    answers.append(str(etag or ""))


def answered_listed(answers: list[str], listed: str) -> bool:
    """Whether a download's GETs were all answered (`answers`: their ETags) by the `listed`
    version, an ETag quoted or bare; never where none was recorded or none was listed."""
    bare = listed.strip('"')
    return bool(answers) and bool(bare) and all(tag.strip('"') == bare for tag in answers)
