"""A bounded load test of `vit-ft serve` on loopback: N concurrent clients send M requests in all (one image
each, multipart), optionally a fraction of malformed ones, against a server with dynamic batching and one without
(--max_batch 1); prints throughput, p50 / p99 latency and errors per setting.

    python -m benchmarks.serve_load outputs/digits --clients 16 --requests 1000 --malformed 0.01
    python -m benchmarks.serve_load outputs/digits --max_batch 1 16 --batch_timeout_ms 5 --rounds 3
    python -m benchmarks.serve_load /tmp/vit-s --vit_s   # a random ViT-S/16 at 224 px (10 labels), made if missing

Each setting starts its own server process (a free port, 127.0.0.1) and stops it with SIGTERM. A malformed
request must get a 4xx and a good one a 200: anything else is an error. Latency is per request, client side.
With `--rounds N` the settings take turns N times (each round a fresh server per setting), and each figure is
the median of the rounds with their min-max. `--ceiling` first times the model alone in this process (no server, no
HTTP, no decoding) on the server's thread count: images/s of a forward at batch 1 and at the largest --max_batch,
interleaved over --rounds, so the ratio is the most dynamic batching can gain on this host.
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


def write_vit_s(folder: Path) -> None:
    """A random ViT-S/16 classifier at 224 px with 10 labels and ViT's image processor: the size the issue's load
    figure asks for, with no training (its answers do not matter, only its cost)."""
    import torch
    from transformers import ViTImageProcessorPil

    from vit_ft import ViTFTConfig, ViTFTForImageClassification
    from vit_ft.model.sizes import VIT_SIZES

    torch.manual_seed(0)
    labels = {i: str(i) for i in range(10)}
    config = ViTFTConfig(**VIT_SIZES["small"], image_size=224, patch_size=16, id2label=labels,
                         label2id={v: k for k, v in labels.items()})  # fmt: skip
    ViTFTForImageClassification(config).eval().save_pretrained(folder)
    ViTImageProcessorPil(size={"height": 224, "width": 224}, resample=3).save_pretrained(folder)


def ceiling(model: str, max_batch: int, threads: int, rounds: int, seconds: float = 2.0) -> str:
    """The model's forward alone at batch 1 and `max_batch` on `threads` threads (the served model, loaded by
    the one trained-folder reader): images/s of each, interleaved `rounds` times (each at least `seconds`), as one line."""
    import torch

    from vit_ft.tools.trained import load_trained

    torch.set_num_threads(threads)
    trained = load_trained(model)
    height, width = trained.preprocessing.image_size
    rates: dict[int, list[float]] = {1: [], max_batch: []}
    with torch.inference_mode():
        for _ in range(rounds + 1):  # the first round warms up, not counted
            for batch in rates:
                pixels = torch.randn(batch, 3, height, width)
                start, count = time.perf_counter(), 0
                while time.perf_counter() - start < seconds or count < 2:
                    trained.logits(pixels)
                    count += 1
                rates[batch].append(batch * count / (time.perf_counter() - start))
    one, most = (float(np.median(r[1:])) for r in rates.values())
    return (f"forward alone, {threads} thread(s), {height}x{width} px: batch 1 {one:.1f} images/s, batch {max_batch} "
            f"{most:.1f} images/s: batching can gain at most {most / one:.2f}x (median of {rounds} rounds)")


def _median_row(rows: list[dict[str, float]]) -> dict[str, str]:
    """Each figure of the rounds as "median (min-max)", or the value alone for one round; errors summed."""
    out = {}
    for key in ("req/s", "p50 ms", "p99 ms"):
        values = sorted(r[key] for r in rows)
        median = float(np.median(values))
        out[key] = f"{median:.1f}" + (f" ({values[0]:.1f}-{values[-1]:.1f})" if len(values) > 1 else "")
    out["errors"], out["malformed"] = str(sum(r["errors"] for r in rows)), str(rows[0]["malformed"])
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--malformed", type=float, default=0.0, help="Fraction of malformed requests (0.01: 1 %%).")
    parser.add_argument("--max_batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--batch_timeout_ms", type=float, default=5.0)
    parser.add_argument("--warmup", type=int, default=32, help="Requests sent before timing.")
    parser.add_argument("--rounds", type=int, default=1, help="Rounds of all settings, taking turns.")
    parser.add_argument("--vit_s", action="store_true", help="Write a random ViT-S/16 at 224 px to MODEL if missing.")
    parser.add_argument("--ceiling", action="store_true", help="First time the model's forward alone, batch 1 vs max.")
    parser.add_argument("--threads", type=int, default=1, help="The server's --threads (its default on 2 cores: 1).")
    parser.add_argument("--serve_args", nargs=argparse.REMAINDER, default=[], help="More `vit-ft serve` flags.")
    args = parser.parse_args(argv)
    if not 0 <= args.malformed < 1 or args.clients < 1 or args.requests < 1 or args.rounds < 1:
        parser.error("--malformed must be in [0, 1), --clients, --requests and --rounds positive")
    if args.vit_s and not Path(args.model, "config.json").is_file():
        write_vit_s(Path(args.model))
    if args.ceiling:
        print(ceiling(args.model, max(args.max_batch), args.threads, args.rounds))
    args.serve_args = ["--threads", str(args.threads), *args.serve_args]
    bodies, results = images(args.model), {max_batch: [] for max_batch in args.max_batch}
    for _ in range(args.rounds):
        for max_batch in args.max_batch:
            results[max_batch].append(_one_setting(args, bodies, max_batch))
    print(f"| max_batch | clients | requests | malformed | req/s | p50 ms | p99 ms | errors |\n|{'---|' * 8}")
    for max_batch, rows in results.items():
        r = _median_row(rows)
        print(f"| {max_batch} | {args.clients} | {args.requests} | {r['malformed']} | {r['req/s']} | {r['p50 ms']} | "
              f"{r['p99 ms']} | {r['errors']} |")  # fmt: skip


def _one_setting(args: argparse.Namespace, bodies: list[bytes], max_batch: int) -> dict[str, float]:
    """One server at `max_batch`: warmed up, loaded, stopped with SIGTERM (a non-zero exit counts as an error)."""
    port = free_port()
    process = start(args.model, port, max_batch, args.batch_timeout_ms, args.serve_args)
    try:
        url = f"http://127.0.0.1:{port}/predict"
        load(url, bodies, min(args.clients, args.warmup), args.warmup, 0.0)
        result = load(url, bodies, args.clients, args.requests, args.malformed)
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=120)
    return {**result, "errors": result["errors"] + (code != 0)}


if __name__ == "__main__":
    main()
