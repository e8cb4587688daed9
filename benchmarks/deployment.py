"""The deployment table's speed half for a model too large to fine-tune here: ViT-B/16 with random weights,
every runtime of `vit-ft export --report` (PyTorch eager and compiled, onnxruntime fp32 and int8, OpenVINO fp32
and int8) at batch 1 (median latency) and batch 32 (images/s), on this host. Accuracy and agreement need a
trained model: `vit-ft export --report` on the digits model gives them (docs/performance.md).

    nice -n 5 python -m benchmarks.deployment --image_size 224 --repeats 3

OpenVINO int8's activation ranges come from random pixels here: a speed measurement, not an accuracy one.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from vit_ft.model.configuration_vit_ft import ViTFTConfig
from vit_ft.model.modeling_vit_ft import ViTFTForImageClassification
from vit_ft.tools.export.onnx import export_model, quantize_int8
from vit_ft.tools.export.onnx_runtime import INT8_FILE, ONNX_FILE
from vit_ft.tools.export.report import (
    INT8_OF,
    LATENCY_BATCH,
    THROUGHPUT_BATCH,
    RuntimeRow,
    host_info,
    recommend_int8,
    time_runners,
)
from vit_ft.tools.export.runtimes import build_runners


def bench_deployment(
    image_size: int = 224, variant: str = "base", patch_size: int = 16, warmup: int = 1, repeats: int = 3,
    compile_backend: str = "inductor", num_labels: int = 1000,
) -> dict:
    """Every runtime's p50 latency at batch 1 and images/s at batch 32 for a random-weight ViT of `variant`."""
    torch.manual_seed(0)
    config = ViTFTConfig.from_variant(variant, patch_size=patch_size, image_size=image_size, num_labels=num_labels)
    model = ViTFTForImageClassification(config).eval()
    trained = SimpleNamespace(model=model)  # what build_runners reads
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        trace, difference = export_model(model, Path(folder) / ONNX_FILE)
        int8_difference = quantize_int8(model, Path(folder) / ONNX_FILE, Path(folder) / INT8_FILE, trace.checks[:1])
        export_seconds = time.perf_counter() - start

        def calibration() -> list[torch.Tensor]:
            return [torch.randn(8, 3, image_size, image_size) for _ in range(2)]

        runners, notes = build_runners(trained, folder, calibration, compile_backend=compile_backend)  # type: ignore[arg-type]
        timings = {}
        for batch in (LATENCY_BATCH, THROUGHPUT_BATCH):
            pixels = torch.randn(batch, 3, image_size, image_size)
            timings[batch] = time_runners(runners, pixels, warmup, repeats)
    rows = {
        name: RuntimeRow(name, accuracy=1.0, latency_ms=timings[1][name] * 1000,
                         throughput=THROUGHPUT_BATCH / timings[THROUGHPUT_BATCH][name])  # fmt: skip
        for name in runners
    }
    faster = {int8: recommend_int8(rows[int8], rows[fp32])[1].split(", accuracy")[0]
              for int8, fp32 in INT8_OF.items() if int8 in rows}  # fmt: skip
    return {
        "model": f"ViT-{variant}/{patch_size} random weights, {image_size} px",
        "warmup": warmup,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "host": host_info(),
        "export_seconds": export_seconds,
        "onnx_max_logit_difference": {"fp32": difference, "int8": int8_difference},
        "latency_ms": {name: row.latency_ms for name, row in rows.items()},
        "images_per_second": {name: row.throughput for name, row in rows.items()},
        "int8_faster": faster,
        "notes": notes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--variant", default="base")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compile_backend", default="inductor")
    args = parser.parse_args()
    print(json.dumps(bench_deployment(args.image_size, args.variant, warmup=args.warmup, repeats=args.repeats,
                                      compile_backend=args.compile_backend), indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
