"""Serve a trained model over HTTP with dynamic batching (LitServe): calibrated probabilities, the OOD score.

vit-ft serve outputs/digits                                   # http://127.0.0.1:8000
vit-ft serve outputs/digits --max_batch 16 --batch_timeout_ms 10 --port 8080
vit-ft serve outputs/digits-onnx --runtime onnx               # an export folder (vit-ft export)
curl -F image=@x.png -F image=@y.jpg 127.0.0.1:8000/predict
curl -H 'Content-Type: application/json' -d '{"images": ["<base64>"]}' 127.0.0.1:8000/predict
(also `python scripts/serve.py ...`)

POST /predict answers {"revision", "runtime", "predictions": [{"name", "labels", "scores", "unsure", "ood_score"}]}
per request: the top-k labels with calibrated probabilities (a multi-label model: every label at or above its
decision threshold), and whether each image looks unlike the training images (unsure; null without a feature
bank) with its score. GET /health, GET /info (labels, input spec, calibration, runtime, versions), /docs.
A bad request (empty, not JSON, not an image, truncated, over --max_pixels or --max_upload_mb, over 32 images)
is a 4xx with one JSON line {"error": ...}; the others are served. SIGTERM drains the requests in flight, exit 0.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..tools.serve.payload import DEFAULT_MAX_UPLOAD_MB, RUNTIMES
from ..utils.cli import ToolArgumentParser, optional_int, run_tool
from ..utils.limits import DEFAULT_MAX_PIXELS
from ..utils.logs import setup_logging
from .model_flags import check_model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ToolArgumentParser(__doc__)
    parser.add_argument("model", help="vit_ft model folder, LoRA adapter folder, Hub id, or export folder (onnx).")
    parser.add_argument("--runtime", choices=RUNTIMES, default="torch",
                        help="torch (any model folder; the OOD score), onnx or openvino (an export folder).")  # fmt: skip
    parser.add_argument("--max_batch", type=int, default=8, help="Requests batched into one forward pass (1: none).")
    parser.add_argument("--batch_timeout_ms", type=float, default=5.0,
                        help="How long a batch waits for more requests once one arrived.")  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1", help="127.0.0.1 (this machine only), 0.0.0.0 or ::.")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--top_k", type=int, default=5,
                        help="Labels per image (single-label models; a multi-label model lists those above threshold).")  # fmt: skip
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available; onnx / openvino: cpu).")
    parser.add_argument("--bf16", choices=("auto", "true", "false"), default="auto",
                        help="bf16 autocast (torch; auto: where measured faster). false keeps float32, as predict's default.")  # fmt: skip
    parser.add_argument("--max_pixels", type=optional_int, default=DEFAULT_MAX_PIXELS,
                        help="Images with more pixels are a 422 (decompression-bomb guard); 'none' disables.")  # fmt: skip
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads of the model's forward pass (torch, onnxruntime, OpenVINO). Default: every "
                             "core this process may use but one, which decoding and the HTTP side need (1 on 2 cores: "
                             "a second thread on a shared core waits on it at every op).")  # fmt: skip
    parser.add_argument("--max_upload_mb", type=float, default=DEFAULT_MAX_UPLOAD_MB, help="Bodies over this are a 413.")
    parser.add_argument("--log_level", default="warning", choices=("debug", "info", "warning", "error"),
                        help="The HTTP server's log level (uvicorn, LitServe).")  # fmt: skip
    return parser.parse_args(argv)


def serve(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse the flags and run `vit_ft.tools.serve.server.run_server` until SIGTERM; returns the model's record."""
    args = parse_args(argv)
    if args.runtime == "torch":
        check_model(args.model, "MODEL")  # a missing or unfinished folder: one line, before loading anything
    elif not os.path.isdir(args.model):
        raise FileNotFoundError(f"MODEL {args.model} is not a folder; --runtime {args.runtime} serves an export folder.")
    setup_logging()
    from ..tools.serve.server import run_server

    return run_server(**vars(args))


def main(argv: list[str] | None = None) -> None:
    """`vit-ft serve MODEL ARGS` (and `scripts/serve.py`): exits 0 when stopped, or 1 with one `error:` line."""
    run_tool(serve, argv)


if __name__ == "__main__":
    main()
