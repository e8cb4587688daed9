"""The headline recipe as a first try, timed: `accelerate launch scripts/finetune.py --recipe dogs --max_steps 2`
with the batch, evaluation and worker limits a user sets for a smoke test, against a local Hub stand-in of the
dogs dataset (120 breeds x 10 = 1,200 training images and 240 test images, JPEG, 384-500 px) and a randomly
initialised ViT-B/16 of google/vit-base-patch16-224-in21k's size (86 M parameters, 224 px checkpoint resampled
to 384). Issue 52: this run took 3 minutes to train and evaluate, then 27 silent minutes in a feature bank of
every training image; each pass after training is now sized by the run and says so. Calibration (40 s) and the
bank's validation fit (52 s) then passed the same 32 validation images twice; one pass gives both now (49 s; the
command 273 s -> 226 s, on 2 CPU cores shared with other jobs).

    python -m benchmarks.dogs_smoke [--workdir DIR]

Prints the wall time of the command, each pass's announcing line, and the bank's size from the run record.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from PIL import Image
from transformers import ViTConfig, ViTImageProcessor, ViTModel

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the Hub stand-in lives with the tests
from tests.fake_hub import FakeHub  # noqa: E402

MODEL_ID, DATASET_ID = "google/vit-base-patch16-224-in21k", "Donghyun99/Stanford-Dogs"
BREEDS, PER_CLASS = 120, {"train": 10, "test": 2}
FIRST_TRY = ["--max_steps", "2", "--per_device_train_batch_size", "8", "--global_batch_size", "8",
             "--per_device_eval_batch_size", "16", "--max_eval_samples", "32", "--eval_steps", "2",
             "--save_steps", "2", "--logging_steps", "1", "--dataloader_num_workers", "0", "--use_cpu", "true",
             "--bf16", "false", "--report_to", "none"]  # fmt: skip
PASS_WORDS = ("Checking", "Calibration", "Feature bank", "Examples", "Report", "Evaluating", "Test")


def photo(label: int, index: int) -> bytes:
    """A photo-sized JPEG: a smooth breed-tinted field (upsampled noise), 384-500 px on a side."""
    rng = np.random.default_rng(1000 * label + index)
    height, width = 384 + 29 * (index % 4), 400 + 25 * (index % 5)
    small = rng.normal(128, 50, (12, 12, 3)) + (label * 37 % 200 - 100)
    image = Image.fromarray(np.clip(small, 0, 255).astype(np.uint8)).resize((width, height), Image.BILINEAR)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=85)
    return buffer.getvalue()


def dataset_files() -> dict[str, bytes]:
    """The stand-in's parquet files and a README naming the breeds and mapping the files to splits."""
    files, names = {}, {i: f"breed-{i:03d}" for i in range(BREEDS)}
    for split, count in PER_CLASS.items():
        rows = [{"image": {"bytes": photo(label, i), "path": f"{label}_{i}.jpg"}, "label": label}
                for label in range(BREEDS) for i in range(count)]  # fmt: skip
        buffer = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), buffer)
        files[f"data/{split}-00000-of-00001.parquet"] = buffer.getvalue()
    features = [{"name": "image", "dtype": "image"}, {"name": "label", "dtype": {"class_label": {"names": names}}}]
    splits = [{"name": s, "num_bytes": len(files[f"data/{s}-00000-of-00001.parquet"]), "num_examples": c * BREEDS}
              for s, c in PER_CLASS.items()]  # fmt: skip
    configs = [{"config_name": "default", "data_files": [{"split": s, "path": f"data/{s}-*"} for s in PER_CLASS]}]
    card = {"dataset_info": {"features": features, "splits": splits}, "configs": configs}
    files["README.md"] = f"---\n{yaml.safe_dump(card, sort_keys=False)}---\n# Stanford Dogs (stand-in)\n".encode()
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=None, help="where to write (default: a temporary folder)")
    work = parser.parse_args().workdir or Path(tempfile.mkdtemp(prefix="dogs-smoke-"))
    backbone = work / "backbone"
    if not (backbone / "config.json").is_file():
        ViTModel(ViTConfig()).save_pretrained(backbone)  # ViT-B/16 at 224, random: the in21k checkpoint's shapes
        ViTImageProcessor().save_pretrained(backbone)
    with FakeHub() as hub:
        hub.add_repo(MODEL_ID, backbone)
        hub.add_repo(DATASET_ID, dataset_files(), repo_type="dataset")
        command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
                   "--mixed_precision", "no", "--dynamo_backend", "no", str(REPO / "scripts" / "finetune.py"),
                   "--recipe", "dogs", *FIRST_TRY, "--output_dir", str(work / "out")]  # fmt: skip
        started = time.perf_counter()
        with open(work / "log.txt", "w") as log:
            code = subprocess.run(command, cwd=work, env=hub.env(work), stdout=log, stderr=subprocess.STDOUT).returncode
        seconds = time.perf_counter() - started
    text = (work / "log.txt").read_text(errors="replace")
    print(f"exit {code} in {seconds:.0f} s ({work})")
    for line in text.splitlines():
        if any(word in line for word in PASS_WORDS) and "%" not in line.split(":")[-1][:3]:
            print("  " + line[:160])
    record = work / "out" / "vit_ft_run.json"
    if record.is_file():
        print("feature bank:", json.dumps(json.loads(record.read_text()).get("feature_bank"))[:300])


if __name__ == "__main__":
    main()
