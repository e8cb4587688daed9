"""What `vit-ft serve` accepts in a `POST /predict` body, and how it refuses the rest: one-line JSON errors
`{"error": "..."}` with a 4xx status, never a 500.

Two bodies are accepted, each with one or several images (at most `MAX_IMAGES` per request):

    curl -F image=@cat.jpg -F image=@dog.png localhost:8000/predict            # multipart, any field names
    curl -H 'Content-Type: application/json' -d '{"images": ["<base64>", {"name": "b.png", "data": "<base64>"}]}' \
        localhost:8000/predict                                                 # or {"image": "<base64>"}

`BodyGuard` (an ASGI middleware in the HTTP server's process) refuses what cannot reach the model: a body over
the stated limit (413), an empty one, JSON that does not parse (400), another content type (415). `image_sources`
(in the inference worker) reads the images of a parsed body or says why not (`Rejected`); an image that does not
decode is refused by the prediction itself, naming it (422).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

MAX_IMAGES = 32  # per request; more is a 413 naming the limit (a batch of requests may hold more in all)
DEFAULT_MAX_UPLOAD_MB = 20.0
RUNTIMES = ("torch", "onnx", "openvino")  # what serves a model (`runtime.load_served`)
PREDICT_PATH = "/predict"
JSON_TYPE, MULTIPART_TYPE = "application/json", "multipart/form-data"
USAGE = (
    "send images as multipart form files (curl -F image=@x.png) or as JSON "
    '{"images": ["<base64>", {"name": "x.png", "data": "<base64>"}]} (or {"image": "<base64>"})'
)


@dataclass(frozen=True)
class Rejected:
    """A request refused before the model runs: the HTTP status and the one-line reason."""

    status: int
    message: str

    def body(self) -> dict[str, str]:
        return {"error": self.message}


def error_body(message: str) -> bytes:
    """The one-line JSON error every refusal answers with."""
    return json.dumps({"error": " ".join(str(message).split())}).encode()


# ---- the worker's side: a parsed body -> its images -------------------------------------------------------------


def _decoded(value: Any, where: str) -> bytes | Rejected:
    """A base64 string (a `data:image/...;base64,` URL too) -> its bytes."""
    if not isinstance(value, str):
        return Rejected(400, f"{where} is a {type(value).__name__}, not a base64 string; {USAGE}.")
    text = value.split(",", 1)[1] if value.startswith("data:") and "," in value else value
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return Rejected(400, f"{where} is not valid base64; {USAGE}.")


def _json_images(body: Any) -> list[tuple[str, Any]] | Rejected:
    """(name, base64 value) of each image of a JSON body."""
    if not isinstance(body, dict) or not ({"image", "images"} & set(body)):
        kind = f"an object with keys {sorted(body)}" if isinstance(body, dict) else f"a JSON {type(body).__name__}"
        return Rejected(400, f"the JSON body is {kind}; {USAGE}.")
    items = body["images"] if "images" in body else [body["image"]]
    if not isinstance(items, list):
        return Rejected(400, f'"images" is a {type(items).__name__}, not a list; {USAGE}.')
    named = []
    for index, item in enumerate(items):
        if isinstance(item, dict):
            named.append((str(item.get("name") or f"images[{index}]"), item.get("data")))
        else:
            named.append((f"images[{index}]", item))
    return named


def _form_images(form: Any) -> list[tuple[str, bytes]]:
    """(file name, bytes) of every uploaded file of a multipart form, whatever its field name."""
    found = []
    for field, value in form.multi_items():
        if hasattr(value, "file"):  # an UploadFile; plain text fields are not images
            value.file.seek(0)
            found.append((value.filename or field, value.file.read()))
    return found


def image_sources(body: Any) -> list[dict[str, Any]] | Rejected:
    """The images of a parsed `/predict` body (a multipart form, or the JSON value) as `{"bytes", "path"}` sources
    that `data.images.load_image` decodes (the path only names the image in errors), or why there are none."""
    if hasattr(body, "multi_items"):
        named: list[tuple[str, Any]] | Rejected = _form_images(body)
    else:
        named = _json_images(body)
    if isinstance(named, Rejected):
        return named
    if not named:
        return Rejected(400, f"the request holds no image; {USAGE}.")
    if len(named) > MAX_IMAGES:
        return Rejected(413, f"the request holds {len(named)} images, over the limit of {MAX_IMAGES} per request; "
                             "split it into several requests.")  # fmt: skip
    sources = []
    for name, value in named:
        data = value if isinstance(value, bytes) else _decoded(value, name)
        if isinstance(data, Rejected):
            return data
        if not data:
            return Rejected(400, f"{name} is empty (0 bytes); {USAGE}.")
        sources.append({"bytes": data, "path": name})
    return sources


# ---- the HTTP server's side: what never reaches the worker -------------------------------------------------------


class BodyGuard:
    """ASGI middleware on `POST /predict`: reads the body (at most `max_bytes`), answers 413 over it, 400 for an
    empty body or JSON that does not parse, 415 for a content type other than JSON or a multipart form; passes
    anything else on with its body replayed. Other paths pass untouched."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != PREDICT_PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body, refused = await self._read(scope, receive)
        refused = refused or await self._check(scope, body)
        if refused is not None:
            await _answer(send, refused)
            return
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if sent:
                return await receive()  # after the body: the disconnect
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read(self, scope: dict, receive: Any) -> tuple[bytes, Rejected | None]:
        limit = f"over the limit of {self.max_bytes / 2**20:g} MB per request (--max_upload_mb)"
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            return b"", Rejected(413, f"the body is {int(length):,} bytes, {limit}.")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return b"", Rejected(413, f"the body is over {self.max_bytes:,} bytes, {limit}.")
            if not message.get("more_body", False):
                break
        return b"".join(chunks), None

    @staticmethod
    async def _check(scope: dict, body: bytes) -> Rejected | None:
        if not body:
            return Rejected(400, f"the request body is empty; {USAGE}.")
        kind = dict(scope["headers"]).get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        if kind == MULTIPART_TYPE:
            return await _check_form(scope, body)
        if kind not in (JSON_TYPE, ""):
            return Rejected(415, f"Content-Type {kind} is not accepted; {USAGE}.")
        try:
            json.loads(body)
        except (ValueError, UnicodeDecodeError) as error:
            return Rejected(400, f"the body is not valid JSON ({error}); {USAGE}.")
        return None


async def _check_form(scope: dict, body: bytes) -> Rejected | None:
    """A multipart body parsed as the server will parse it (Starlette's parser): a malformed one is a 400 here,
    where LitServe would answer it with a 500."""
    from starlette.datastructures import Headers
    from starlette.formparsers import MultiPartException, MultiPartParser

    async def stream():  # type: ignore[no-untyped-def]
        yield body

    try:
        form = await MultiPartParser(Headers(scope=scope), stream()).parse()
    except (MultiPartException, ValueError, KeyError) as error:
        return Rejected(400, f"the multipart body is malformed ({error}); {USAGE}.")
    await form.close()
    return None


async def _answer(send: Any, refused: Rejected) -> None:
    body = error_body(refused.message)
    headers = [(b"content-type", JSON_TYPE.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": refused.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


__all__ = [
    "DEFAULT_MAX_UPLOAD_MB",
    "MAX_IMAGES",
    "RUNTIMES",
    "USAGE",
    "BodyGuard",
    "Rejected",
    "error_body",
    "image_sources",
]
