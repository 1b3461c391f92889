"""The names of cached shard files: a digest of the shard's key, then the end of its URL's
basename (which keeps its extension, by which readers tell compression apart), short enough
for any file system's NAME_MAX."""

from __future__ import annotations

import hashlib
import re

# The basename kept in a cached file's name: with the digest, the temporary file's and the
# reservation's suffixes, names stay under NAME_MAX (255) however long the URL's basename.
_MAX_BASE = 100
_DIGEST = 24  # hex digits of a cached file's name (`cached_name`)
CACHED_NAME = re.compile(rf"[0-9a-f]{{{_DIGEST}}}-.")


def cached_name(key: str, url: str) -> str:
    """The name of the cached file of `key`: a digest of it, then the end of `url`'s basename
    (which keeps the extension, which readers use to tell compression apart)."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST]
    return f"{digest}-{_base(url)}"


def _base(url: str) -> str:
    """The end of `url`'s basename (which keeps its extension), for a file name: at most
    `_MAX_BASE` bytes in UTF-8, as NAME_MAX counts bytes (a CJK character takes 3). A NUL
    or a lone surrogate, which no file name holds (an object's name may: a bare ValueError
    at every use of the cached file), is a `?`: the digest before it tells names apart."""
    base = (url.rstrip("/").rsplit("/", 1)[-1] or "shard")[-_MAX_BASE:]
    base = base.replace("\0", "?").encode("utf-8", "replace").decode("utf-8")
    while len(base.encode("utf-8")) > _MAX_BASE:
        base = base[1:]
    return base
