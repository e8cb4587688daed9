"""A local stand-in for the Hub: what `huggingface_hub`, `transformers` and `datasets` call to push and download.

Start it, seed it with `add_repo` (a model folder, or a dataset's files), point a subprocess at it with
`HF_ENDPOINT=<server.url>` (huggingface_hub reads it when imported), push or download, then inspect what happened:
`server.repos[repo_id]` maps each model file's path to its bytes (`server.datasets` for dataset repos),
`server.calls` lists (method, path) in order, `server.downloads` every (repo_type, repo_id, path) whose bytes were
served, and `server.unexpected` every request it could not answer (a test asserts it is empty).

Uploads: files are always accepted as "regular" (inline base64 in the commit), so no LFS or Xet storage is
involved. Downloads: repo info, tree listings, paths-info and `resolve` with the headers the clients read
(`X-Repo-Commit`, `ETag` = the git blob id, `Content-Length`, byte ranges); a missing file, repo or revision gets
the Hub's 404 with its `X-Error-Code`, which the clients turn into their "not found" errors (transformers probes
for optional files that way), so those are answers, not unexpected requests.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

import yaml

USER = "tester"
_TYPE = r"(?P<type>model|dataset)s"
_REPO = r"(?P<repo>[\w.-]+/[\w.-]+|[\w.-]+)"
_REV = r"(?P<rev>[^/?]+)"  # quoted: "refs%2Fconvert%2Fparquet" is one segment
PREUPLOAD = re.compile(rf"^/api/{_TYPE}/{_REPO}/preupload/{_REV}$")
COMMIT = re.compile(rf"^/api/{_TYPE}/{_REPO}/commit/{_REV}$")
REPO_INFO = re.compile(rf"^/api/{_TYPE}/{_REPO}(?:/revision/{_REV})?$")
TREE = re.compile(rf"^/api/{_TYPE}/{_REPO}/tree/{_REV}(?:/(?P<path>.*))?$")
PATHS_INFO = re.compile(rf"^/api/{_TYPE}/{_REPO}/paths-info/{_REV}$")
RESOLVE = re.compile(rf"^/(?P<prefix>datasets/)?{_REPO}/resolve/{_REV}/(?P<path>.+)$")
DATE = "2026-01-01T00:00:00.000Z"
# What a user's shell may export that changes where the Hub clients go, whether they go at all, and as whom: a
# process pointed at the stand-in gets none of them from its parent (`FakeHub.env` sets its own), so a suite run
# in a cluster's shell (TRANSFORMERS_OFFLINE=1 beside HF_HUB_OFFLINE=1, a token, a shared HF_HOME) answers as CI's.
HUB_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_EVALUATE_OFFLINE", "HF_ENDPOINT",
                 "HF_HOME", "HF_TOKEN")  # fmt: skip

Response = tuple[int, dict[str, str], bytes]


def git_blob_id(data: bytes) -> str:
    """The id git (and the Hub, for a regular file) gives these bytes: sha1 of "blob <size>\\0<data>"."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def tar_shard(samples: list[tuple[str, dict[str, bytes]]]) -> bytes:
    """A webdataset shard: a tar whose files are `<key>.<extension>` for each (key, {extension: bytes}), in order
    (datasets' webdataset builder turns each extension into a column: "jpg" an image, "cls" an int)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for key, files in samples:
            for extension, data in files.items():
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def parquet_bytes(rows: list[dict[str, Any]]) -> bytes:
    """A parquet file of `rows` (an image column as {"bytes", "path"} structs), as a Hub dataset's data file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    return buffer.getvalue()


def dataset_card(features: list[dict[str, Any]], splits: dict[str, int], data_files: dict[str, str]) -> bytes:
    """A dataset README whose `dataset_info` states the features and each split's size (what
    `DatasetInfo.splits` reads) and whose `configs` block maps the files (glob patterns) to splits."""
    card = {
        "dataset_info": {
            "features": features,
            "splits": [{"name": name, "num_bytes": 0, "num_examples": count} for name, count in splits.items()],
        },
        "configs": [
            {
                "config_name": "default",
                "data_files": [{"split": split, "path": path} for split, path in data_files.items()],
            }
        ],
    }
    return f"---\n{yaml.safe_dump(card, sort_keys=False)}---\n# test stand-in\n".encode()


def _json(status: int, body: Any, **headers: str) -> Response:
    return status, {"Content-Type": "application/json", **headers}, json.dumps(body).encode()


class Refused(Exception):
    """Raised by a lookup to answer with `response` (a Hub error) instead of the endpoint's body."""

    def __init__(self, response: Response) -> None:
        super().__init__(response[0])
        self.response = response


def _not_found(code: str, message: str, commit: str | None = None) -> Response:
    """The Hub's 404: the clients read X-Error-Code to tell a missing repo, revision or file apart."""
    headers = {"X-Error-Code": code, "X-Error-Message": message}
    if commit:
        headers["X-Repo-Commit"] = commit
    return _json(404, {"error": message}, **headers)


class FakeHub:
    """A ThreadingHTTPServer on 127.0.0.1 (a free port) in a daemon thread; use as a context manager."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, bytes]] = {}  # model repos
        self.datasets: dict[str, dict[str, bytes]] = {}  # dataset repos
        self.heads: dict[tuple[str, str], str] = {}  # (repo_type, repo_id) -> the commit id of main
        self.private: set[tuple[str, str]] = set()
        self.created: list[dict[str, Any]] = []
        self.validated: list[str] = []
        self.commits: list[dict[str, Any]] = []
        self.calls: list[tuple[str, str]] = []
        self.downloads: list[tuple[str, str, str]] = []
        self.unexpected: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def env(self, home: Path, token: str | None = "dummy") -> dict[str, str]:
        """The environment of a process that talks to this stand-in: this process's, less every Hub variable of
        the parent's (`HUB_VARIABLES`, any other HF_*, and PYTHON*), plus the endpoint, its own HF_HOME under
        `home` (no cached login or cache of the user's) and `token` (None: a user without one)."""
        kept = {k: v for k, v in os.environ.items() if k not in HUB_VARIABLES and not k.startswith(("HF_", "PYTHON"))}
        env = {**kept, "HF_ENDPOINT": self.url, "HF_HOME": str(Path(home) / "hf_home")}
        env |= {"HF_HUB_DISABLE_TELEMETRY": "1", "NO_PROXY": "127.0.0.1,localhost"}
        return env if token is None else {**env, "HF_TOKEN": token}

    def add_repo(self, repo_id: str, files: dict[str, bytes] | Path, repo_type: str = "model") -> str:
        """Seed a public repo with `files` (path -> bytes, or every file under a folder); returns its commit id."""
        if isinstance(files, Path):
            files = {
                p.relative_to(files).as_posix(): p.read_bytes()
                for p in sorted(files.rglob("*"))
                if p.is_file()
            }
        with self.lock:
            self._store(repo_type)[repo_id] = dict(files)
            return self._new_head(repo_type, repo_id, b"seed")

    def downloaded(self, repo_type: str = "model") -> set[str]:
        """The ids of the repos of `repo_type` whose files were served."""
        return {repo_id for kind, repo_id, _ in self.downloads if kind == repo_type}

    def _store(self, repo_type: str) -> dict[str, dict[str, bytes]]:
        return self.datasets if repo_type == "dataset" else self.repos

    def _new_head(self, repo_type: str, repo_id: str, salt: bytes) -> str:
        """A new commit id (40 hex digits, as git's) for the repo's files as they are now; it becomes main."""
        digest = hashlib.sha1(salt + repr((repo_type, repo_id, len(self.commits))).encode())
        for path, data in sorted(self._store(repo_type)[repo_id].items()):
            digest.update(path.encode() + b"\0" + git_blob_id(data).encode())
        self.heads[repo_type, repo_id] = digest.hexdigest()
        return self.heads[repo_type, repo_id]

    # --- pushes; each returns a Response ---

    def create_repo(self, body: dict[str, Any]) -> Response:
        repo_id = f"{body.get('organization') or USER}/{body['name']}"
        repo_type = body.get("type") or "model"
        self.created.append(body)
        prefix = "datasets/" if repo_type == "dataset" else ""
        if repo_id in self._store(repo_type):
            return _json(
                409, {"error": "You already created this repo", "url": f"{self.url}/{prefix}{repo_id}"}
            )
        self._store(repo_type)[repo_id] = {}
        self._new_head(repo_type, repo_id, b"create")
        if body.get("private") or body.get("visibility") == "private":
            self.private.add((repo_type, repo_id))
        return _json(200, {"url": f"{self.url}/{prefix}{repo_id}", "name": repo_id, "id": repo_id})

    def validate_yaml(self, body: dict[str, Any]) -> Response:
        content = body.get("content", "")
        self.validated.append(content)
        match = re.match(r"^---\n(.*?)\n---", content, re.S)
        try:
            metadata = yaml.safe_load(match.group(1)) if match else None
        except yaml.YAMLError as error:
            return _json(400, {"errors": [{"message": f"invalid YAML: {error}"}]})
        if not isinstance(metadata, dict):
            return _json(400, {"errors": [{"message": "the README has no YAML metadata block"}]})
        return _json(200, {"errors": [], "warnings": []})

    def preupload(self, repo_type: str, repo_id: str, body: dict[str, Any]) -> Response:
        if repo_id not in self._store(repo_type):
            return _not_found("RepoNotFound", f"Repository {repo_id} not found")
        files = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in body["files"]]
        return _json(200, {"files": files, "commitOid": self.heads[repo_type, repo_id]})

    def commit(self, repo_type: str, repo_id: str, revision: str, payload: bytes) -> Response:
        if repo_id not in self._store(repo_type):
            return _not_found("RepoNotFound", f"Repository {repo_id} not found")
        lines = [json.loads(line) for line in payload.splitlines() if line.strip()]
        header, operations = lines[0], lines[1:]
        if header.get("key") != "header":
            return _json(400, {"error": "the first NDJSON line must be the header"})
        files = self._store(repo_type)[repo_id]
        for op in operations:
            if op["key"] != "file" or op["value"].get("encoding") != "base64":
                return _json(
                    400, {"error": f"this fake Hub only takes regular base64 files, got {op['key']}"}
                )
            files[op["value"]["path"]] = base64.b64decode(op["value"]["content"])
        oid = self._new_head(repo_type, repo_id, payload)
        self.commits.append(
            {
                "repo_type": repo_type,
                "repo_id": repo_id,
                "revision": revision,
                "header": header["value"],
                "oid": oid,
            }
        )
        prefix = "datasets/" if repo_type == "dataset" else ""
        return _json(200, {"commitUrl": f"{self.url}/{prefix}{repo_id}/commit/{oid}", "commitOid": oid,
                           "pullRequestUrl": None})  # fmt: skip

    def whoami(self) -> Response:
        return _json(200, {"type": "user", "name": USER, "orgs": [], "auth": {"type": "access_token"}})

    # --- downloads ---

    def _lookup(
        self, repo_type: str, repo_id: str, revision: str, token: bool
    ) -> tuple[dict[str, bytes], str]:
        """The files and commit id at `revision` (main or the head's commit id); Refused if there are none."""
        files = self._store(repo_type).get(repo_id)
        if files is None or ((repo_type, repo_id) in self.private and not token):
            # the Hub answers 401 for a missing repo too, so that private names do not leak
            raise Refused(_json(401, {"error": "Repository not found"}, **{"X-Error-Code": "RepoNotFound"}))
        head = self.heads[repo_type, repo_id]
        if unquote(revision) not in ("main", head):
            raise Refused(_not_found("RevisionNotFound", f"Invalid rev id: {unquote(revision)}"))
        return files, head

    def repo_info(self, repo_type: str, repo_id: str, revision: str | None, token: bool) -> Response:
        files, head = self._lookup(repo_type, repo_id, revision or "main", token)
        info = {
            "id": repo_id,
            "author": repo_id.split("/")[0] if "/" in repo_id else None,
            "sha": head,
            "private": (repo_type, repo_id) in self.private,
            "gated": False,
            "disabled": False,
            "lastModified": DATE,
            "createdAt": DATE,
            "tags": [],
            "siblings": [{"rfilename": path} for path in sorted(files)],
        }
        if repo_type == "model":
            info["modelId"] = repo_id
        match = re.match(r"^---\n(.*?)\n---", files.get("README.md", b"").decode(errors="replace"), re.S)
        if match:
            info["cardData"] = yaml.safe_load(match.group(1))
        return _json(200, info)

    def _entry(self, files: dict[str, bytes], path: str, head: str, expand: bool) -> dict[str, Any]:
        if path in files:
            entry = {"type": "file", "oid": git_blob_id(files[path]), "size": len(files[path]), "path": path}
        else:
            entry = {
                "type": "directory",
                "oid": hashlib.sha1(path.encode()).hexdigest(),
                "size": 0,
                "path": path,
            }
        if expand:
            entry["lastCommit"] = {"id": head, "title": "upload", "date": DATE}
        return entry

    @staticmethod
    def _folders(files: dict[str, bytes]) -> set[str]:
        return {"/".join(path.split("/")[:i]) for path in files for i in range(1, path.count("/") + 1)}

    def tree(
        self, repo_type: str, repo_id: str, revision: str, path: str, query: dict, token: bool
    ) -> Response:
        files, head = self._lookup(repo_type, repo_id, revision, token)
        path = unquote(path or "").strip("/")
        folders = self._folders(files)
        if path and path not in folders:
            return _not_found("EntryNotFound", f"{path} does not exist on {revision}", head)
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        expand = query.get("expand", ["false"])[0].lower() == "true"
        prefix = f"{path}/" if path else ""
        below = sorted(p for p in (*folders, *files) if p.startswith(prefix))
        if not recursive:
            below = [p for p in below if "/" not in p[len(prefix) :]]
        return _json(200, [self._entry(files, p, head, expand) for p in below])

    def paths_info(self, repo_type: str, repo_id: str, revision: str, body: bytes, token: bool) -> Response:
        files, head = self._lookup(repo_type, repo_id, revision, token)
        form = parse_qs(body.decode())
        expand = form.get("expand", ["false"])[0].lower() == "true"
        known = set(files) | self._folders(files)
        paths = [p.strip("/") for p in form.get("paths", [])]
        return _json(200, [self._entry(files, p, head, expand) for p in paths if p in known])

    def resolve(
        self,
        method: str,
        repo_type: str,
        repo_id: str,
        revision: str,
        path: str,
        range_: str | None,
        token: bool,
    ) -> Response:
        files, head = self._lookup(repo_type, repo_id, revision, token)
        path = unquote(path)
        if path not in files:
            return _not_found("EntryNotFound", f"{path} does not exist on {unquote(revision)}", head)
        data = files[path]
        headers = {"X-Repo-Commit": head, "ETag": f'"{git_blob_id(data)}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}  # fmt: skip
        status = 200
        if range_ and (match := re.fullmatch(r"bytes=(\d*)-(\d*)", range_.strip())):
            start, end = match.groups()
            if start:
                first, last = int(start), min(int(end) if end else len(data) - 1, len(data) - 1)
            else:  # "bytes=-N": the last N bytes
                first, last = max(len(data) - int(end), 0), len(data) - 1
            if first >= len(data):
                return 416, {"Content-Range": f"bytes */{len(data)}"}, b""
            headers["Content-Range"] = f"bytes {first}-{last}/{len(data)}"
            data, status = data[first : last + 1], 206
        if method == "GET":
            self.downloads.append((repo_type, repo_id, path))
        return status, headers, data


def _handler_for(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # keep pytest output clean
            pass

        def _answer(self, method: str, response: Response) -> None:
            status, headers, body = response
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(body)

        def _dispatch(self, method: str, path: str, query: dict, raw: bytes) -> Response:
            token = self.headers.get("authorization", "").startswith("Bearer ")
            if method == "GET" and path == "/api/agent-harnesses":  # huggingface_hub's user-agent registry
                return _json(200, {"standardEnvVars": [], "harnesses": {}})
            if method in ("GET", "HEAD") and (m := RESOLVE.match(path)):
                repo_type = "dataset" if m["prefix"] else "model"
                return hub.resolve(
                    method, repo_type, m["repo"], m["rev"], m["path"], self.headers.get("Range"), token
                )
            if method == "GET" and (m := TREE.match(path)):
                return hub.tree(m["type"], m["repo"], m["rev"], m["path"], query, token)
            if method == "POST" and (m := PATHS_INFO.match(path)):
                return hub.paths_info(m["type"], m["repo"], m["rev"], raw, token)
            if method == "GET" and (m := REPO_INFO.match(path)):
                return hub.repo_info(m["type"], m["repo"], m["rev"], token)
            # everything below writes, and the Hub wants a token for it
            if not token:
                hub.unexpected.append((method, f"{path} (no token)"))
                return _json(401, {"error": "Invalid credentials in Authorization header"})
            if method == "POST" and path == "/api/repos/create":
                return hub.create_repo(json.loads(raw))
            if method == "POST" and path == "/api/validate-yaml":
                return hub.validate_yaml(json.loads(raw))
            if method == "GET" and path == "/api/whoami-v2":
                return hub.whoami()
            if method == "POST" and (m := PREUPLOAD.match(path)):
                return hub.preupload(m["type"], m["repo"], json.loads(raw))
            if method == "POST" and (m := COMMIT.match(path)):
                return hub.commit(m["type"], m["repo"], m["rev"], raw)
            hub.unexpected.append((method, path))
            return _json(404, {"error": f"the fake Hub does not serve {method} {path}"})

        def _route(self, method: str) -> None:
            path, _, query = self.path.partition("?")
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            with hub.lock:
                hub.calls.append((method, path))
                try:
                    response = self._dispatch(method, path, parse_qs(query), raw)
                except Refused as refused:
                    response = refused.response
                except Exception as error:  # a request the fake Hub misread: the test must see it
                    hub.unexpected.append((method, f"{path} ({error!r})"))
                    response = _json(500, {"error": repr(error)})
            self._answer(method, response)

        def do_GET(self) -> None:
            self._route("GET")

        def do_HEAD(self) -> None:
            self._route("HEAD")

        def do_POST(self) -> None:
            self._route("POST")

        def do_PUT(self) -> None:
            self._route("PUT")

        def do_DELETE(self) -> None:
            self._route("DELETE")

    return Handler
