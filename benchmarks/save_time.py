"""How long a preemption checkpoint takes to write: a ViT-B/16 at 384 px (what recipes/slurm/finetune.sbatch's
early signal must leave time for), saved as Trainer saves a checkpoint after a step: the model
(model.safetensors), AdamW's state and the scheduler (optimizer.pt, scheduler.pt), the RNG states and
trainer_state.json (`Trainer._save_checkpoint`). One optimizer step first, so that AdamW's moments exist. Each
save is timed as Trainer returns from it (the files written into the page cache: what the process must finish
before its launcher's SIGKILL) and again with every file fsynced (on the disk: what a node failure would need).

    python -m benchmarks.save_time                        # 3 saves into a temporary folder under the current one
    python -m benchmarks.save_time --dir /scratch/me --repeats 5 --size base --image_size 384

Prints each save's seconds, the median and the spread, the checkpoint's size and the host (the figure in
docs/fine-tuning.md, "Many nodes", and the sbatch's comment, came from here).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import TrainingArguments

from vit_ft.model.configuration_vit_ft import ViTFTConfig
from vit_ft.model.modeling_vit_ft import ViTFTForImageClassification
from vit_ft.model.sizes import VIT_SIZES
from vit_ft.training.trainer import FineTuneTrainer
from vit_ft.utils.hardware import cpu_model

NUM_LABELS = 120  # the dogs recipe's classes


def trained_trainer(folder: Path, size: str, image_size: int) -> FineTuneTrainer:
    """Our Trainer over a ViT-`size`/16 at `image_size`, after one AdamW step (the optimizer state is whole)."""
    config = ViTFTConfig(**VIT_SIZES[size], image_size=image_size, patch_size=16, num_labels=NUM_LABELS)
    model = ViTFTForImageClassification(config)
    args = TrainingArguments(output_dir=str(folder), report_to=[], use_cpu=not torch.cuda.is_available(),
                             learning_rate=1e-5, save_strategy="steps", logging_strategy="no")  # fmt: skip
    trainer = FineTuneTrainer(model=model, args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=100)
    pixels = torch.randn(1, 3, image_size, image_size, device=trainer.args.device)
    labels = torch.zeros(1, dtype=torch.long, device=trainer.args.device)
    trainer.model(pixel_values=pixels, labels=labels).loss.backward()
    trainer.optimizer.step()
    trainer.lr_scheduler.step()
    trainer.optimizer.zero_grad()
    return trainer


def _fsync_all(folder: Path) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            descriptor = os.open(path, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)


def time_saves(trainer: FineTuneTrainer, repeats: int) -> tuple[list[float], list[float], int]:
    """Seconds of each of `repeats` checkpoint saves (each into its own checkpoint-N, removed after), the same
    with the files fsynced, and the checkpoint's bytes."""
    saved, synced, size = [], [], 0
    for step in range(1, repeats + 1):
        trainer.state.global_step = step
        folder = Path(trainer.args.output_dir) / f"checkpoint-{step}"
        start = time.perf_counter()
        trainer._save_checkpoint(trainer.model, trial=None)
        saved.append(time.perf_counter() - start)
        _fsync_all(folder)
        synced.append(time.perf_counter() - start)
        size = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
        shutil.rmtree(folder)
    return saved, synced, size


def _summary(name: str, seconds: list[float]) -> str:
    each = ", ".join(f"{s:.2f}" for s in seconds)
    return (f"{name}: median {statistics.median(seconds):.2f} s, spread {min(seconds):.2f}-{max(seconds):.2f} s "
            f"({each})")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", default=".", help="where the checkpoints are written (the disk to time)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", default="base", choices=sorted(VIT_SIZES))
    parser.add_argument("--image_size", type=int, default=384)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="save-time-") as folder:
        trainer = trained_trainer(Path(folder), args.size, args.image_size)
        saved, synced, size = time_saves(trainer, args.repeats)
    print(f"ViT-{args.size}/16 at {args.image_size} px, {size / 2**20:.0f} MiB a checkpoint, on {platform.node()} "
          f"({cpu_model()}, {torch.get_num_threads()} threads), into {Path(args.dir).resolve()}")  # fmt: skip
    print(_summary("saved", saved))
    print(_summary("saved and fsynced", synced))


if __name__ == "__main__":
    main()
