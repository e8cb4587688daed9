"""vit_ft.tools.fewshot.run and scripts/fewshot.py: a pre-trained checkpoint against random init, and the command."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import ViTImageProcessorPil

from vit_ft import ViTFTConfig
from vit_ft.data.images import VIT_MEAN, VIT_STD
from vit_ft.model.export import export_to_transformers
from vit_ft.model.modeling_vit_ft import ViTFTForImageClassification
from vit_ft.tools.fewshot import FewShotOptions, run_fewshot
from vit_ft.tools.fewshot.probe import L2_GRID
from vit_ft.training.pretrain import read_image_folder
from vit_ft.utils.output_dir import OUTPUT_RECORD, record_outputs

from ...conftest import REPO, TINY

# ---- a pre-trained checkpoint against random init -----------------------------------------------------------


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from a second thread, and on a loaded machine its synchronisation costs tens of
    times the work: run them on one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pretrained_tiny(digits, tmp_path_factory) -> Path:
    """A tiny ViT (TINY size) pre-trained for 200 steps on 400 digits training images at 16x16, saved as a
    transformers ViTModel checkpoint without a head, like the digits recipe's: a few seconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as `one_thread`
    pixels, labels, classes = read_image_folder(digits / "train", TINY["image_size"])
    generator = torch.Generator().manual_seed(0)
    chosen = torch.randperm(len(pixels), generator=generator)[:400]
    pixels, labels = pixels[chosen], labels[chosen]
    torch.manual_seed(0)
    model = ViTFTForImageClassification(ViTFTConfig(**TINY, num_labels=len(classes))).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(200):
        batch = torch.randint(0, len(pixels), (64,), generator=generator)
        loss = model(pixels[batch], labels=labels[batch]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.set_num_threads(threads)
    size = {"height": TINY["image_size"], "width": TINY["image_size"]}
    processor = ViTImageProcessorPil(size=size, image_mean=list(VIT_MEAN), image_std=list(VIT_STD))
    folder = tmp_path_factory.mktemp("pretrained") / "vit"
    return export_to_transformers(model.eval(), folder, image_processor=processor, with_head=False)


def test_pretrained_checkpoint_scores_clearly_above_random_init_of_the_same_size(
    pretrained_tiny, digits, tmp_path, one_thread
):
    def mean_accuracy(random_init: bool) -> dict[int, float]:
        options = FewShotOptions(shots=(1, 5), seeds=2, random_init=random_init, bf16="false", progress=False)
        record = run_fewshot(pretrained_tiny, digits, tmp_path / str(random_init), options)
        assert record["feature_dim"] == TINY["hidden_size"] and record["num_test_images"] == 360
        return {r["shots"]: r["mean_accuracy"] for r in record["results"]}

    pretrained, random = mean_accuracy(False), mean_accuracy(True)
    for k in (1, 5):
        assert pretrained[k] > random[k] + 0.1, (k, pretrained, random)
    assert (
        random[1] > 0.12
    )  # random features still carry some signal: the comparison is not with a broken run


# ---- the command ------------------------------------------------------------------------------------------


def run_script(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "fewshot.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},  # a tiny model: see `one_thread`
    )


def test_command_prints_the_table_writes_the_files_and_refuses_a_wrong_shots_value(
    hf_backbone_dir, small_digits, tmp_path
):
    broken = small_digits.parent / "with_broken"
    shutil.copytree(small_digits, broken)
    (broken / "test" / "1" / "broken.png").write_bytes(b"not a png")  # skipped with its reason
    out = tmp_path / "report"
    (out / "runs").mkdir(parents=True)  # the user's files beside an earlier few-shot report: kept as they are
    mine = {out / "notes.txt": b"my notes", out / "runs" / "keep.csv": b"a,b\n"}
    for path, data in mine.items():
        path.write_bytes(data)
        os.utime(path, (1e9, 1e9))
    (out / "fewshot.md").write_text("earlier")
    record_outputs(out, "fewshot", ["fewshot.md"])
    common = ["--model", hf_backbone_dir, "--dataset", str(broken), "--output_dir", str(out)]
    result = run_script(*common, "--shots", "1,2", "--seeds", "2", "--bf16", "false", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert all(path.read_bytes() == data and path.stat().st_mtime == 1e9 for path, data in mine.items())
    assert "| shots per class | accuracy (mean ± std over seeds) |" in result.stdout
    record = json.loads((out / "fewshot.json").read_text())
    assert [r["shots"] for r in record["results"]] == [1, 2]
    assert all(len(r["accuracies"]) == 2 and len(r["l2"]) == 2 for r in record["results"])
    assert all(0 <= a <= 1 for r in record["results"] for a in r["accuracies"])
    assert all(v in L2_GRID for r in record["results"] for v in r["l2"])
    assert [s["source"].endswith("broken.png") for s in record["skipped"]] == [True]
    assert "| 1 |" in (out / "fewshot.md").read_text()
    assert (out / "fewshot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in out.iterdir()) == [
        OUTPUT_RECORD, "fewshot.json", "fewshot.md", "fewshot.png", "notes.txt", "runs"]  # fmt: skip

    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    wrong = run_script(*common, "--shots", "0,1", cwd=tmp_path)
    assert wrong.returncode == 1 and wrong.stderr.count("\n") == 1, wrong.stderr[-3000:]
    assert wrong.stderr.startswith("error: --shots 0,1 must be a comma list of positive numbers"), (
        wrong.stderr
    )
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    # in process (a second start-up costs more than the rest): class "0" has 12 images, 2 held out, 10 left
    with pytest.raises(ValueError, match=r"--shots 11 needs 11 .* class '0' has 10 .* up to 10"):
        run_fewshot(hf_backbone_dir, broken, out, FewShotOptions(shots=(1, 11), seeds=1, progress=False))
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
