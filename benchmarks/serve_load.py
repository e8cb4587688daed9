"""A bounded load test of `vit-ft serve` on loopback: N concurrent clients send M requests in all (one image
each, multipart), optionally a fraction of malformed ones, against a server with dynamic batching and one without
(--max_batch 1); prints throughput, p50 / p99 latency and errors per setting.

    python benchmarks/serve_load.py outputs/digits --clients 16 --requests 1000 --malformed 0.01
    python benchmarks/serve_load.py outputs/digits --max_batch 1 16 --batch_timeout_ms 5

Each setting starts its own server process (a free port, 127.0.0.1) and stops it with SIGTERM. A malformed
request must get a 4xx and a good one a 200: anything else is an error. Latency is per request, client side.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def images(model: str, count: int = 16) -> list[bytes]:
    """The model folder's examples/ (PNG bytes), or random 64x64 images."""
    found = sorted(Path(model, "examples").glob("*.png"))[:count]
    if found:
        return [p.read_bytes() for p in found]
    rng, out = np.random.default_rng(0), []
    for _ in range(count):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return out


def start(model: str, port: int, max_batch: int, timeout_ms: float, extra: list[str]) -> subprocess.Popen:
    command = [sys.executable, "-m", "vit_ft", "serve", model, "--port", str(port), "--max_batch", str(max_batch),
               "--batch_timeout_ms", str(timeout_ms), *extra]  # fmt: skip
    process = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    process.kill()
    raise RuntimeError(f"the server for max_batch {max_batch} did not start")


def load(url: str, bodies: list[bytes], clients: int, requests: int, malformed: float) -> dict[str, float]:
    """`requests` requests from `clients` threads; -> throughput, p50 / p99 latency (ms), errors."""
    rng = np.random.default_rng(1)
    bad = set(rng.choice(requests, int(round(malformed * requests)), replace=False).tolist())
    latencies, errors, counter, lock = [], 0, iter(range(requests)), threading.Lock()

    def client() -> None:
        nonlocal errors
        with httpx.Client(timeout=60) as session:
            while True:
                with lock:
                    index = next(counter, None)
                if index is None:
                    return
                body = b"not an image" if index in bad else bodies[index % len(bodies)]
                begin = time.perf_counter()
                status = session.post(url, files=[("image", (f"{index}.png", body, "image/png"))]).status_code
                took = time.perf_counter() - begin
                with lock:
                    latencies.append(took)
                    errors += not ((400 <= status < 500) if index in bad else status == 200)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    begin = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - begin
    ms = np.asarray(latencies) * 1000
    return {"req/s": requests / wall, "p50 ms": float(np.percentile(ms, 50)), "p99 ms": float(np.percentile(ms, 99)),
            "errors": errors, "malformed": len(bad)}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--malformed", type=float, default=0.0, help="Fraction of malformed requests (0.01: 1 %%).")
    parser.add_argument("--max_batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--batch_timeout_ms", type=float, default=5.0)
    parser.add_argument("--warmup", type=int, default=32, help="Requests sent before timing.")
    parser.add_argument("--serve_args", nargs=argparse.REMAINDER, default=[], help="More `vit-ft serve` flags.")
    args = parser.parse_args(argv)
    if not 0 <= args.malformed < 1 or args.clients < 1 or args.requests < 1:
        parser.error("--malformed must be in [0, 1), --clients and --requests positive")
    bodies = images(args.model)
    print(f"| max_batch | clients | requests | malformed | req/s | p50 ms | p99 ms | errors |\n|{'---|' * 8}")
    for max_batch in args.max_batch:
        port = free_port()
        process = start(args.model, port, max_batch, args.batch_timeout_ms, args.serve_args)
        try:
            url = f"http://127.0.0.1:{port}/predict"
            load(url, bodies, min(args.clients, args.warmup), args.warmup, 0.0)
            r = load(url, bodies, args.clients, args.requests, args.malformed)
        finally:
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=120)
        print(f"| {max_batch} | {args.clients} | {args.requests} | {r['malformed']} | {r['req/s']:.1f} | "
              f"{r['p50 ms']:.1f} | {r['p99 ms']:.1f} | {r['errors']} |" + ("" if code == 0 else f" (exit {code})"))  # fmt: skip


if __name__ == "__main__":
    main()
