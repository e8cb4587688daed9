"""The Python half of scripts/gpu_check.sh: each step's work that is not a fine-tune or the benchmark, and each
step's key figure for summary.md. `python benchmarks/gpu_check.py STEP ARGS` (the script calls it; `--cpu` for its
tiny CPU mode):

  env                          the modules the fine-tune needs (one line naming the first missing one, exit 2),
                               then the versions, the device, the cores and /dev/shm's size
  data WORK                    offline stand-ins: a random ViT-B/16 checkpoint (tiny with --cpu) and class
                               folders of synthetic JPEGs (500x375, photo-like) in WORK
  loader WORK SIZE WORKERS...  the fine-tune's worker path (decode + random-resized crop, uint8 out) in a
                               DataLoader of batch 32 over WORK's JPEGs: steady-state images/s per worker count
  figure STEP ...              a step's key figure from what it left (see `FIGURES`)
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # run as a file, as the check runs it (its figures then import no torch: the package's __init__ does): the
    # repository, not this folder, goes first on the path (benchmarks/profile.py would shadow the standard library's)
    sys.path[0] = str(Path(__file__).resolve().parents[1])

# what a fine-tune imports beyond torch; a GPU image lacks some (datasets, evaluate, kornia: carry their wheels)
NEEDED = ("transformers", "accelerate", "peft", "datasets", "evaluate", "kornia", "safetensors", "sklearn",
          "matplotlib", "yaml", "PIL", "huggingface_hub", "pyarrow")  # fmt: skip
VERSIONS = ("torch", "transformers", "accelerate", "peft", "datasets", "evaluate", "kornia", "timm")
CLASSES, TEST_PER_CLASS = 20, 10
CPU_CLASSES = 4


def check_modules(names: tuple[str, ...] = NEEDED) -> str | None:
    """The one line for the first module that does not import (a missing wheel names itself), else None."""
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as error:
            missing = getattr(error, "name", None) or name
            need = f" (needed by {name})" if missing != name else ""
            return (
                f"gpu_check: no module {missing}{need}: put its wheel in wheels/ beside the repository (the pip "
                f"download line in scripts/gpu_check.sh's header) and run it again ({type(error).__name__}: {error})"
            )
    return None


def environment() -> str:
    """One line: versions, the device, cores and /dev/shm."""
    import torch

    versions = []
    for name in VERSIONS:
        try:
            versions.append(f"{name} {importlib.import_module(name).__version__}")
        except ImportError:
            versions.append(f"{name} not installed")
    if torch.cuda.is_available():
        device = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"
    else:
        device = "no GPU (CPU)"
    shm = shutil.disk_usage("/dev/shm").total / 2**30 if os.path.isdir("/dev/shm") else 0.0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    python = ".".join(map(str, sys.version_info[:3]))
    return f"{device}; Python {python}, {', '.join(versions)}; {cores} cores; /dev/shm {shm:.1f} GiB"


def _write_jpeg(job: tuple[str, str, int, int, int, int]) -> None:
    from benchmarks.data import synthetic_photo

    folder, name, width, height, seed, _ = job
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / name).write_bytes(synthetic_photo(width, height, seed=seed))


def write_data(work: Path, cpu: bool, per_class: int) -> str:
    """A random ViT-B/16 (224 px, the in21k checkpoint's shape; tiny on the CPU) with its image processor, and
    train / test class folders of synthetic JPEGs."""
    import torch
    from transformers import ViTConfig, ViTImageProcessor, ViTModel

    tiny = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
            "image_size": 32, "patch_size": 8}  # fmt: skip
    config = ViTConfig(**tiny) if cpu else ViTConfig()
    torch.manual_seed(0)  # the same random backbone in every check
    ViTModel(config, add_pooling_layer=False).save_pretrained(work / "vit")
    ViTImageProcessor(size={"height": config.image_size, "width": config.image_size}).save_pretrained(work / "vit")
    classes, (width, height) = (CPU_CLASSES, (64, 48)) if cpu else (CLASSES, (500, 375))
    jobs = [
        (str(work / "data" / split / f"class{c:02d}"), f"{i}.jpg", width, height, c * 10_000 + i + offset, 0)
        for split, count, offset in (("train", per_class, 0), ("test", TEST_PER_CLASS, 5_000))
        for c in range(classes)
        for i in range(count)
    ]
    with ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        list(pool.map(_write_jpeg, jobs, chunksize=64))
    model = "tiny ViT" if cpu else "random ViT-B/16"
    return f"{model}; {classes} classes x {per_class} train + {TEST_PER_CLASS} test JPEGs of {width}x{height}"


def loader_rates(work: Path, size: int, worker_counts: list[int], batches: int) -> list[tuple[int, float]]:
    """Steady-state images/s of the fine-tune's worker path (build_transforms(device_augmentation=True): the
    JPEG decoded at reduced size, a random-resized crop, uint8 out; the rest runs per batch on the device) in a
    DataLoader of batch 32 with each number of workers, past the workers' start and their prefetched batches."""
    import torch

    from vit_ft.data.collate import collate_fn
    from vit_ft.data.transforms import build_transforms

    files = sorted(str(p) for p in (work / "data" / "train").glob("*/*.jpg"))
    transform = build_transforms(size, (0.5,) * 3, (0.5,) * 3, train=True, device_augmentation=True, seed=0)

    class Images(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(files)

        def __getitem__(self, i: int) -> dict:
            out = transform({"image": [{"path": files[i], "bytes": None}], "label": [0]})
            return {"pixel_values": out["pixel_values"][0], "labels": 0}

    rates = []
    for workers in worker_counts:
        warm = 2 * workers + 1
        sampler = torch.utils.data.RandomSampler(range(len(files)), replacement=True, num_samples=32 * (warm + batches))
        loader = torch.utils.data.DataLoader(Images(), batch_size=32, sampler=sampler, num_workers=workers,
                                             collate_fn=collate_fn, pin_memory=torch.cuda.is_available())  # fmt: skip
        batch_iter = iter(loader)
        for _ in range(warm):
            next(batch_iter)
        start = time.perf_counter()
        images = sum(batch["pixel_values"].shape[0] for batch in batch_iter)
        rates.append((workers, images / (time.perf_counter() - start)))
    return rates


# ---- key figures --------------------------------------------------------------------------------------------------


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def run_figure(output_dir: Path) -> str:
    """A fine-tune's steps, images/s, last logged loss and accuracies, from its output folder."""
    state = _json(output_dir / "trainer_state.json")
    results = _json(output_dir / "all_results.json")
    losses = [entry["loss"] for entry in state.get("log_history", []) if "loss" in entry]
    parts = [f"{state.get('global_step', '?')} steps"]
    if "train_samples_per_second" in results:
        parts.append(f"{results['train_samples_per_second']:.0f} train images/s")
    if losses:
        parts.append(f"last loss {losses[-1]:.4f}")
    parts += [f"{key} {results[key]:.4f}" for key in ("eval_accuracy", "test_accuracy") if key in results]
    return ", ".join(parts)


def gpu_samples_figure(samples: Path) -> str:
    """Peak GPU memory and mean / median utilisation from nvidia-smi's CSV samples (timestamp, memory.used
    [MiB], utilization.gpu [%]), the idle samples before the first busy one left out."""
    rows = []
    if samples.is_file():
        for row in csv.reader(samples.read_text().splitlines()[1:]):
            try:
                rows.append((float(row[1].split()[0]), float(row[2].split()[0])))
            except (IndexError, ValueError):
                continue
    busy = [i for i, (_, util) in enumerate(rows) if util > 0]
    if not busy:
        return "GPU not sampled (no nvidia-smi samples)"
    rows = rows[busy[0] : busy[-1] + 1]
    utils = [util for _, util in rows]
    return (
        f"GPU memory peak {max(mem for mem, _ in rows) / 1024:.1f} GiB, utilisation mean {statistics.mean(utils):.0f}% "
        f"median {statistics.median(utils):.0f}% ({len(rows)} samples)"
    )


def resume_figure(resumed: Path, uninterrupted: Path) -> str:
    """The resumed run against the uninterrupted one: steps, and the difference of their last losses."""
    losses = {}
    for name, folder in (("resumed", resumed), ("uninterrupted", uninterrupted)):
        history = _json(folder / "trainer_state.json").get("log_history", [])
        losses[name] = [entry["loss"] for entry in history if "loss" in entry]
    figure = run_figure(resumed)
    if losses["resumed"] and losses["uninterrupted"]:
        difference = abs(losses["resumed"][-1] - losses["uninterrupted"][-1])
        figure += f"; last loss differs from the uninterrupted run's by {difference:.2e}"
    return figure


def bench_figure(result: Path) -> str:
    """The gpu section in short: per workload (inference, training step) and reference, ours against it eager
    and each at its best of eager and compiled (images/s and ratio); the model FLOP utilisation."""
    rows = _json(result).get("rows", [])
    if not rows:
        return "no rows (see the log)"
    parts = []
    for row in rows:
        workload = "inference" if row["measurement"].startswith("inference") else "training"
        if "FLOP utilisation" in row["measurement"]:
            parts.append(f"training MFU {row['ratio']:.2f} ({row['candidate_value']:.1f} of {row['reference_value']:.1f} "
                         f"{row['unit']})")  # fmt: skip
            continue
        if ": eager" in row["measurement"] and "against eager" not in row["measurement"]:
            how = "eager"
        elif "each at its best" in row["measurement"]:
            how = "best of eager/compiled"
        else:
            continue  # compiled against eager: in benchmark.md
        reference = row["reference"].split(" (")[0].split(" + ")[0]
        parts.append(f"{workload} {how} vs {reference}: {row['candidate_value']:.0f} vs {row['reference_value']:.0f} "
                     f"images/s (x{row['ratio']:.2f})")  # fmt: skip
    return "; ".join(parts)


FIGURES = {
    "run": lambda args: run_figure(Path(args[0])),
    "gpu": lambda args: gpu_samples_figure(Path(args[0])),
    "resume": lambda args: resume_figure(Path(args[0]), Path(args[1])),
    "bench": lambda args: bench_figure(Path(args[0])),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/gpu_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("env", "data", "loader", "figure"))
    parser.add_argument("args", nargs="*")
    parser.add_argument("--cpu", action="store_true", help="the tiny CPU mode")
    parser.add_argument("--per-class", type=int, default=200, help="training JPEGs per class (data)")
    parser.add_argument("--batches", type=int, default=40, help="timed batches per worker count (loader)")
    options = parser.parse_args(argv)
    if options.step == "env":
        missing = check_modules()
        if missing:
            print(missing, file=sys.stderr)
            return 2
        print(environment())
    elif options.step == "data":
        print(write_data(Path(options.args[0]), options.cpu, options.per_class))
    elif options.step == "loader":
        work, size, counts = Path(options.args[0]), int(options.args[1]), [int(n) for n in options.args[2:]]
        rates = loader_rates(work, size, counts, options.batches)
        print(", ".join(f"{workers} workers {rate:.0f} images/s" for workers, rate in rates) + f" ({size} px, uint8 crops)")
    else:
        print(FIGURES[options.args[0]](options.args[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
