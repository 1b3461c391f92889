"""A stand-in for the Hugging Face hub on loopback, for `hf://` reads while online.

The hub cannot be reached from the test machines, so this serves dataset repos from local
folders through the few HTTP routes huggingface_hub's `HfFileSystem` calls: a revision's
repo info, the recursive file tree, paths info, the repo's refs, a revision's commits, and
file bytes (with `Range`). Point a client at it with `HF_ENDPOINT`. It answers only what those
calls need; every request is logged (method and path), so tests can check what was fetched.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from tests.loopback import serve_in_thread

SILENT_S = 30.0  # how long a request of a `silent` kind waits unanswered


class Hub:
    """Dataset repos: `repos[repo_id][revision]` is the folder holding that revision's files.

    Each (repo, revision, folder) is a commit whose sha `sha()` gives; a revision is asked for
    by name or by sha. `add` again moves the revision to a new commit (the old one stays
    readable by its sha). `fail[route]` (a route kind: "revision", "tree", "resolve") lists
    HTTP statuses the next requests of that kind get instead, one each; requests of a kind in
    `silent` get no answer (the handler waits `SILENT_S`, then closes); `on_unknown` runs on a
    request for a route the hub does not know (tests use one to mark their log, or to move a
    branch mid-run).
    """

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, Path]] = {}
        self.commits: dict[tuple[str, str], Path] = {}  # (repo, sha) -> folder
        self.history: dict[
            tuple[str, str], list[str]
        ] = {}  # (repo, revision) -> shas, newest first
        self.log: list[tuple[str, str, str]] = []  # method, unquoted path, Range header
        self.fail: dict[str, list[int]] = {}
        self.silent: set[str] = set()
        self.on_unknown: Callable[[str], None] = lambda path: None

    def add(self, repo: str, revision: str, folder: Path) -> None:
        self.repos.setdefault(repo, {})[revision] = folder
        sha = self.sha(repo, revision, folder)
        self.commits[(repo, sha)] = folder
        self.history.setdefault((repo, revision), []).insert(0, sha)

    @staticmethod
    def sha(repo: str, revision: str, folder: Path) -> str:
        return _sha(f"{repo}@{revision}:{folder}")

    def folder(self, repo: str, revision: str) -> Path | None:
        """The folder of a revision (a name or a sha); None when there is none."""
        if revision in self.repos.get(repo, {}):
            return self.repos[repo][revision]
        return self.commits.get((repo, revision))

    def head(self, repo: str, revision: str) -> str:
        """The sha a revision (a name or a sha) points at."""
        if revision in self.repos.get(repo, {}):
            return self.sha(repo, revision, self.repos[repo][revision])
        return revision

    def files(self, repo: str, revision: str) -> dict[str, Path]:
        folder = self.folder(repo, revision)
        assert folder is not None
        found = (p for p in sorted(folder.rglob("*")) if p.is_file())
        return {p.relative_to(folder).as_posix(): p for p in found}


def _sha(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def _entry(path: str, file: Path) -> dict[str, Any]:
    data = file.read_bytes()
    return {"type": "file", "oid": hashlib.sha1(data).hexdigest(), "size": len(data), "path": path}


def _split(route: str) -> tuple[str, str, str] | None:
    """`org/name/<kind>/<revision>/<path>` (revision URL-quoted) into (repo, revision, path)."""
    parts = route.split("/", 4)
    if len(parts) < 4:
        return None
    return f"{parts[0]}/{parts[1]}", unquote(parts[3]), parts[4] if len(parts) > 4 else ""


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _json(self, value: Any, status: int = 200) -> None:
            body = json.dumps(value).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _missing(self, code: str = "RepoNotFound", status: int = 404) -> None:
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _known(self, repo: str, revision: str) -> bool:
            """Whether the revision exists; answers the hub's 404 when not."""
            if hub.folder(repo, revision) is not None:
                return True
            self._missing("RevisionNotFound" if repo in hub.repos else "RepoNotFound")
            return False

        def _failing(self, kind: str) -> bool:
            statuses = hub.fail.get(kind)
            if not statuses:
                return False
            self._missing("Failure", statuses.pop(0))
            return True

        def do_GET(self) -> None:
            self._serve(body=True)

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_POST(self) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.log.append(("POST", path, ""))
            length = int(self.headers.get("Content-Length") or 0)
            payload = self.rfile.read(length).decode()
            prefix = "/api/datasets/"
            where = _split(path[len(prefix) :]) if path.startswith(prefix) else None
            if where is None or "/paths-info/" not in path:
                self._missing()
                return
            if not self._known(*where[:2]):
                return
            repo, revision, _ = where
            try:
                asked = json.loads(payload)["paths"]
            except ValueError:  # a form: paths=a&paths=b
                from urllib.parse import parse_qs

                asked = parse_qs(payload)["paths"]
            files = hub.files(repo, revision)
            self._json([_entry(p, files[p]) for p in asked if p in files])

        def _serve(self, *, body: bool) -> None:
            path = urlsplit(self.path).path
            hub.log.append((self.command, unquote(path), self.headers.get("Range") or ""))
            if path.startswith("/api/datasets/"):
                self._api(path[len("/api/datasets/") :])
                return
            if path.startswith("/datasets/"):
                self._resolve(path[len("/datasets/") :], body=body)
                return
            hub.on_unknown(unquote(path))
            self._missing("EntryNotFound")

        def _api(self, route: str) -> None:
            if route.endswith("/refs") and route.count("/") == 2:
                self._refs(route[: -len("/refs")])
                return
            if route.count("/") == 1:  # the repo's info at its default revision
                route = f"{route}/revision/main"
            where = _split(route)
            if where is None:
                self._missing()
                return
            kind = route.split("/")[2]
            if kind in hub.silent:
                time.sleep(SILENT_S)
                self.close_connection = True
                return
            if self._failing(kind) or not self._known(*where[:2]):
                return
            repo, revision, rest = where
            if kind == "commits":  # the revision's commits, newest first
                shas = hub.history.get((repo, revision), [hub.head(repo, revision)])
                entry = {
                    "authors": [],
                    "date": "2026-01-01T00:00:00.000Z",
                    "title": "",
                    "message": "",
                }
                self._json([{"id": sha, **entry} for sha in shas])
                return
            files = hub.files(repo, revision)
            if kind == "revision":
                siblings = [{"rfilename": p} for p in files]
                sha = hub.head(repo, revision)
                self._json({"id": repo, "sha": sha, "siblings": siblings, "private": False})
            elif kind == "tree":
                under = unquote(rest).strip("/")
                prefix = f"{under}/" if under else ""
                entries = [_entry(p, f) for p, f in files.items() if p.startswith(prefix)]
                folders = {
                    p[:i]
                    for p in files
                    if p.startswith(prefix)
                    for i in range(len(prefix), len(p))
                    if p[i] == "/"
                }
                entries += [
                    {"type": "directory", "oid": _sha(d), "size": 0, "path": d} for d in folders
                ]
                self._json(sorted(entries, key=lambda e: e["path"]))
            else:
                self._missing()

        def _refs(self, repo: str) -> None:
            """The repo's branches and converted layouts (no tags, no pull requests)."""
            if repo not in hub.repos:
                self._missing()
                return
            named = sorted(hub.repos[repo])
            ref = {"branches": [], "converts": [], "tags": []}
            for name in named:
                kind, short = (
                    ("converts", name.rsplit("/", 1)[-1])
                    if name.startswith("refs/convert/")
                    else ("branches", name)
                )
                full = name if kind == "converts" else f"refs/heads/{name}"
                sha = hub.head(repo, name)
                ref[kind].append({"name": short, "ref": full, "targetCommit": sha})
            self._json(ref)

        def _resolve(self, route: str, *, body: bool) -> None:
            parts = route.split("/", 4)
            if len(parts) < 5 or parts[2] != "resolve":
                self._missing()
                return
            repo, revision, name = f"{parts[0]}/{parts[1]}", unquote(parts[3]), unquote(parts[4])
            if self._failing("resolve") or not self._known(repo, revision):
                return
            if name not in hub.files(repo, revision):
                self._missing("EntryNotFound")
                return
            data = hub.files(repo, revision)[name].read_bytes()
            status, start, end = 200, 0, len(data)
            asked = self.headers.get("Range")
            if asked and asked.startswith("bytes="):
                first, _, last = asked[len("bytes=") :].partition("-")
                if first == "":  # the last N bytes
                    start = max(0, len(data) - int(last))
                else:
                    start, end = int(first), min(len(data), int(last) + 1 if last else len(data))
                status = 206
            chunk = data[start:end]
            self.send_response(status)
            self.send_header("Content-Length", str(len(chunk)))
            self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
            self.send_header("X-Repo-Commit", hub.head(repo, revision))
            self.send_header("Accept-Ranges", "bytes")
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
            self.end_headers()
            if body:
                self.wfile.write(chunk)

    return Handler


@contextlib.contextmanager
def serve(hub: Hub) -> Iterator[str]:
    """Serves `hub` on 127.0.0.1 in a thread; yields its endpoint URL."""
    with serve_in_thread(_handler(hub)) as url:
        yield url
