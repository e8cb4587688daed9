"""`vit-ft serve`: the model checked and described in this process, then LitServe's server (its HTTP process and
one inference worker that loads the model again) on `host:port` until SIGTERM or Ctrl-C, which drain the requests
in flight (uvicorn's graceful shutdown) and return.

    run_server("outputs/digits", port=8000, max_batch=8, batch_timeout_ms=5)

Endpoints: POST /predict (`payload`), GET /health (LitServe's: 200 "ok" once the worker is ready), GET /info
(LitServe's, with this model's record under "model": labels, input spec, calibration, runtime, versions), and the
OpenAPI page FastAPI gives (/docs).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
from collections.abc import Callable
from typing import Any

from ...data.images import DEFAULT_MAX_PIXELS
from ...utils.hardware import cpu_cores
from .payload import DEFAULT_MAX_UPLOAD_MB, BodyGuard, error_body

logger = logging.getLogger("vit_ft")

HOSTS = ("127.0.0.1", "0.0.0.0", "::")  # what LitServe binds to
REQUEST_TIMEOUT_S = 60.0  # a request waiting longer in LitServe's queue is a 504


def check_serving(host: str, port: int, max_batch: int, batch_timeout_ms: float, max_upload_mb: float) -> None:
    """A ValueError or OSError naming the fix for a flag the server cannot start with: host, a port out of range
    or taken, batching, the upload limit. Checked before the model loads."""
    if host not in HOSTS:
        raise ValueError(f"--host {host} is not one of {', '.join(HOSTS)} (127.0.0.1: this machine only).")
    if not 1024 <= port <= 65535:
        raise ValueError(f"--port {port} is not in 1024..65535; pass a free port such as 8000.")
    if max_batch < 1:
        raise ValueError(f"--max_batch {max_batch} must be at least 1 (1: no batching).")
    if not 0 <= batch_timeout_ms < 1000 * REQUEST_TIMEOUT_S:
        raise ValueError(f"--batch_timeout_ms {batch_timeout_ms} must be in [0, {1000 * REQUEST_TIMEOUT_S:g}).")
    if not max_upload_mb > 0:
        raise ValueError(f"--max_upload_mb {max_upload_mb} must be positive.")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
        try:
            probe.bind((host, port))
        except OSError as error:
            raise OSError(
                f"--port {port} on {host} is taken ({error.strerror}); stop what listens there or pass another --port."
            ) from None


def build_server(
    model: str, info: dict[str, Any], runtime: str = "torch", max_batch: int = 8, batch_timeout_ms: float = 5.0,
    top_k: int = 5, bf16: str | bool = False, max_pixels: int | None = DEFAULT_MAX_PIXELS,
    max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB, device: str | None = None, threads: int = 1,
) -> Any:  # fmt: skip
    """The LitServer: one inference worker on `device` (cpu, cuda; None: LitServe's choice, the CPU for an ONNX
    runtime) with `threads` CPU threads, dynamic batching of up to `max_batch` requests, the body guard and
    one-line JSON errors."""
    import litserve as ls
    from fastapi.responses import Response
    from starlette.exceptions import HTTPException  # FastAPI's is one too

    from .api import ClassifierAPI

    api = ClassifierAPI(model, runtime, top_k, bf16, max_pixels, info["revision"], threads,
                        max_batch_size=max_batch, batch_timeout=batch_timeout_ms / 1000)  # fmt: skip
    accelerator = "cpu" if runtime != "torch" else (device or "auto").split(":")[0]
    server = ls.LitServer(
        api, accelerator=accelerator, devices=1, timeout=REQUEST_TIMEOUT_S, model_metadata=info,
        middlewares=[(BodyGuard, {"max_bytes": int(max_upload_mb * 2**20)})],
    )  # fmt: skip

    async def one_line(request: Any, error: HTTPException) -> Response:  # LitServe's and FastAPI's refusals
        return Response(error_body(error.detail), error.status_code, media_type="application/json")

    server.app.add_exception_handler(HTTPException, one_line)
    return server


def _on_sigterm(main_pid: int) -> Callable[[int, object], None]:
    """SIGTERM's handler: in this process, a KeyboardInterrupt, on which LitServe's run stops uvicorn (which drains
    the requests in flight) and then the worker; a second SIGTERM (sent to the whole process group) is ignored so
    that it does not cut the drain short. In uvicorn's forked process, which re-raises the SIGTERM it drained on:
    a quiet exit 0."""

    def terminated(signum: int, frame: object) -> None:
        if os.getpid() != main_pid:
            raise SystemExit(0)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    return terminated


def run_server(
    model: str, runtime: str = "torch", host: str = "127.0.0.1", port: int = 8000, max_batch: int = 8,
    batch_timeout_ms: float = 5.0, top_k: int = 5, device: str | None = None, bf16: str | bool = False,
    max_pixels: int | None = DEFAULT_MAX_PIXELS, max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB,
    log_level: str = "warning", threads: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Check the flags and the model (loaded here once, so that a bad one is one line before the server starts),
    then serve until SIGTERM / Ctrl-C; returns the model's /info record."""
    if top_k < 1:
        raise ValueError(f"--top_k {top_k} must be positive.")
    if threads is not None and threads < 1:
        raise ValueError(f"--threads {threads} must be positive; leave it out for every core but one.")
    threads = threads or max(1, cpu_cores() - 1)
    check_serving(host, port, max_batch, batch_timeout_ms, max_upload_mb)
    from .runtime import load_served

    served = load_served(model, runtime, device, bf16, max_pixels)
    info = {**served.info, "threads": threads}
    del served
    gc.collect()  # the worker loads its own copy
    server = build_server(model, info, runtime, max_batch, batch_timeout_ms, top_k, bf16, max_pixels,
                          max_upload_mb, device, threads)  # fmt: skip
    logger.info(
        "Serving %s (%s, revision %s, %d CPU thread(s)) at http://%s:%d: POST /predict, GET /health, /info, /docs; "
        "batches of up to %d requests within %g ms. SIGTERM or Ctrl-C stops it.",
        model, runtime, info["revision"], threads, host, port, max_batch, batch_timeout_ms,
    )  # fmt: skip
    previous = signal.signal(signal.SIGTERM, _on_sigterm(os.getpid()))
    try:
        server.run(host=host, port=port, log_level=log_level, generate_client_file=False, num_api_servers=1)
    finally:
        signal.signal(signal.SIGTERM, previous)
    logger.info("Server stopped.")
    return info


__all__ = ["HOSTS", "build_server", "check_serving", "run_server"]
