"""A local stand-in for the Hub API: just the endpoints `HfApi.create_repo` + `upload_folder` call.

Start it, point a subprocess at it with `HF_ENDPOINT=<server.url>` (huggingface_hub reads it when imported),
push, then inspect what arrived: `server.repos[repo_id]` maps each path to its bytes, `server.calls` lists
(method, path) in order, `server.unexpected` every request it could not answer. Files are always accepted as
"regular" (inline base64 in the commit), so no LFS or Xet storage is involved.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import yaml

USER = "tester"
_REPO = r"(?P<repo>[\w.-]+(?:/[\w.-]+)?)"
PREUPLOAD = re.compile(rf"^/api/models/{_REPO}/preupload/(?P<rev>[^/?]+)$")
COMMIT = re.compile(rf"^/api/models/{_REPO}/commit/(?P<rev>[^/?]+)$")


class FakeHub:
    """A ThreadingHTTPServer on 127.0.0.1 (a free port) in a daemon thread; use as a context manager."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, bytes]] = {}
        self.created: list[dict[str, Any]] = []
        self.validated: list[str] = []
        self.commits: list[dict[str, Any]] = []
        self.calls: list[tuple[str, str]] = []
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

    # --- the endpoints; each returns (status, json body) ---

    def create_repo(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        repo_id = f"{body.get('organization') or USER}/{body['name']}"
        self.created.append(body)
        if repo_id in self.repos:
            return 409, {"error": "You already created this model repo", "url": f"{self.url}/{repo_id}"}
        self.repos[repo_id] = {}
        return 200, {"url": f"{self.url}/{repo_id}", "name": repo_id, "id": repo_id}

    def validate_yaml(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        content = body.get("content", "")
        self.validated.append(content)
        match = re.match(r"^---\n(.*?)\n---", content, re.S)
        try:
            metadata = yaml.safe_load(match.group(1)) if match else None
        except yaml.YAMLError as error:
            return 400, {"errors": [{"message": f"invalid YAML: {error}"}]}
        if not isinstance(metadata, dict):
            return 400, {"errors": [{"message": "the README has no YAML metadata block"}]}
        return 200, {"errors": [], "warnings": []}

    def preupload(self, repo_id: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if repo_id not in self.repos:
            return 404, {"error": f"Repository {repo_id} not found"}
        files = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in body["files"]]
        return 200, {"files": files, "commitOid": "0" * 40}

    def commit(self, repo_id: str, revision: str, payload: bytes) -> tuple[int, dict[str, Any]]:
        if repo_id not in self.repos:
            return 404, {"error": f"Repository {repo_id} not found"}
        lines = [json.loads(line) for line in payload.splitlines() if line.strip()]
        header, operations = lines[0], lines[1:]
        if header.get("key") != "header":
            return 400, {"error": "the first NDJSON line must be the header"}
        files = self.repos[repo_id]
        for op in operations:
            if op["key"] != "file" or op["value"].get("encoding") != "base64":
                return 400, {"error": f"this fake Hub only takes regular base64 files, got {op['key']}"}
            files[op["value"]["path"]] = base64.b64decode(op["value"]["content"])
        oid = hashlib.sha1(payload).hexdigest()
        self.commits.append({"repo_id": repo_id, "revision": revision, "header": header["value"], "oid": oid})
        return 200, {
            "commitUrl": f"{self.url}/{repo_id}/commit/{oid}",
            "commitOid": oid,
            "pullRequestUrl": None,
        }

    def whoami(self) -> tuple[int, dict[str, Any]]:
        return 200, {"type": "user", "name": USER, "orgs": [], "auth": {"type": "access_token"}}


def _handler_for(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # keep pytest output clean
            pass

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self, method: str) -> None:
            path = self.path.split("?")[0]
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            with hub.lock:
                hub.calls.append((method, path))
                if (
                    method == "GET" and path == "/api/agent-harnesses"
                ):  # huggingface_hub's user-agent registry
                    result = (200, {"standardEnvVars": [], "harnesses": {}})
                elif not self.headers.get("authorization", "").startswith("Bearer "):
                    hub.unexpected.append((method, f"{path} (no token)"))
                    result = (401, {"error": "Invalid credentials in Authorization header"})
                elif method == "POST" and path == "/api/repos/create":
                    result = hub.create_repo(json.loads(raw))
                elif method == "POST" and path == "/api/validate-yaml":
                    result = hub.validate_yaml(json.loads(raw))
                elif method == "GET" and path == "/api/whoami-v2":
                    result = hub.whoami()
                elif method == "POST" and (m := PREUPLOAD.match(path)):
                    result = hub.preupload(m["repo"], json.loads(raw))
                elif method == "POST" and (m := COMMIT.match(path)):
                    result = hub.commit(m["repo"], m["rev"], raw)
                else:
                    hub.unexpected.append((method, path))
                    result = (404, {"error": f"the fake Hub does not serve {method} {path}"})
            self._answer(*result)

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

        def do_PUT(self) -> None:
            self._route("PUT")

        def do_DELETE(self) -> None:
            self._route("DELETE")

    return Handler
