"""NaFlex against square crops (issue 36, item 2) on wide images whose class a centre square crop cuts off.

    python -m benchmarks.naflex --out /tmp/naflex      # one JSON line per arm, the table of docs/model.md

The set: 3:1 images (32x96) of grey noise with one coloured square (red, green or blue: the class) near the left
or the right edge, at random; a centre square crop (what evaluation does with `image_size`) keeps the middle third,
where no mark ever is. The same tiny ViT (random init, patch 8), trained the same way, once on square crops of
`image_size` 32 (16 patches: random resized crops in training, the centre crop in evaluation) and once with
`max_num_patches` 16 (NaFlex: each image 16x48, 12 patches, whole; the fine-tune's random crop about its own
aspect ratio in training). Both see at most 16 patches an image; the test split's accuracy of each is printed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

CLASSES = {"red": (220, 40, 40), "green": (40, 200, 40), "blue": (40, 60, 230)}
SIZE = (32, 96)  # (height, width): 3:1
MARK = 10  # pixels: the mark's side
TINY_VIT = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 128,
            "image_size": 32, "patch_size": 8}  # fmt: skip
BUDGET = 16  # patches: the square arm's 4x4 grid, the NaFlex arm's at most


def wide_image(label: str, rng: np.random.Generator) -> Image.Image:
    """Grey noise with the class's mark near the left or the right edge (never in the middle third)."""
    height, width = SIZE
    pixels = rng.integers(90, 166, (height, width, 3)).astype(np.uint8)
    top = int(rng.integers(2, height - MARK - 2))
    left = int(rng.integers(1, 8)) if rng.random() < 0.5 else int(rng.integers(width - MARK - 8, width - MARK - 1))
    pixels[top : top + MARK, left : left + MARK] = CLASSES[label]
    return Image.fromarray(pixels)


def write_split(folder: Path, per_class: int, seed: int) -> Path:
    """`folder/<class>/<i>.png`, `per_class` images of each class."""
    rng = np.random.default_rng(seed)
    for label in CLASSES:
        (folder / label).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            wide_image(label, rng).save(folder / label / f"{i}.png")
    return folder


def write_checkpoint(folder: Path, seed: int) -> Path:
    """A tiny randomly initialised ViT (no head) as the starting checkpoint: both arms start from it."""
    import torch

    from vit_ft import ViTFTConfig, ViTFTModel

    torch.manual_seed(seed)
    ViTFTModel(ViTFTConfig(**TINY_VIT)).save_pretrained(folder)
    return folder


def recipe(root: Path, arm: str, seed: int, epochs: int, per_class: int) -> dict[str, Any]:
    """The fine-tune's recipe values for one arm ("square" or "naflex") of the comparison."""
    values = {
        "model_name_or_path": str(root / "checkpoint"),
        "image_size": TINY_VIT["image_size"],
        "train_dir": str(root / "train"),
        "validation_dir": str(root / "validation"),
        "test_dir": str(root / "test"),
        "crop_scale_min": 0.6,
        "optim": "adamw_torch",
        "learning_rate": 0.002,
        "weight_decay": 0.05,
        "warmup_steps": 10,
        "num_train_epochs": epochs,
        "per_device_train_batch_size": 32,
        "per_device_eval_batch_size": 64,
        "eval_strategy": "epoch",
        "save_strategy": "no",
        "logging_steps": 10,
        "dataloader_num_workers": 0,
        "report_to": "none",
        "output_dir": str(root / arm),
        "seed": seed,
    }
    if arm == "naflex":
        values["max_num_patches"] = BUDGET
    return values


def run_arm(root: Path, arm: str, seed: int, epochs: int, per_class: int) -> dict[str, Any]:
    """Fine-tune one arm (`python -m vit_ft finetune`) and read its test accuracy."""
    path = root / f"{arm}.yaml"
    values = recipe(root, arm, seed, epochs, per_class)
    path.write_text("\n".join(f"{key}: {json.dumps(value)}" for key, value in values.items()) + "\n")
    done = subprocess.run([sys.executable, "-m", "vit_ft", "finetune", "--recipe", str(path)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the {arm} fine-tune failed:\n{done.stderr[-3000:]}")
    results = json.loads((root / arm / "all_results.json").read_text())
    return {"arm": arm, "test_accuracy": results.get("test_accuracy"), "epochs": epochs, "seed": seed,
            "train_images": per_class * len(CLASSES), "max_patches": BUDGET}  # fmt: skip


def prepare(root: Path, per_class: int, seed: int) -> None:
    write_split(root / "train", per_class, seed)
    write_split(root / "validation", max(2, per_class // 4), seed + 1)
    write_split(root / "test", max(2, per_class // 2), seed + 2)
    write_checkpoint(root / "checkpoint", seed)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="a new folder for the data and both runs")
    parser.add_argument("--per_class", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    prepare(args.out, args.per_class, args.seed)
    for arm in ("square", "naflex"):
        print(json.dumps(run_arm(args.out, arm, args.seed, args.epochs, args.per_class)), flush=True)


if __name__ == "__main__":
    main()
