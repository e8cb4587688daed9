"""`exclude:` in the fine-tune (vit_ft.data.exclusions): an audit's findings.csv drops the images it names, a
relabel.csv drops, relabels or keeps each as its action says, in the training split and the validation images held
out of it; bad files are one `error:` line each; a fine-tune records what it applied, and a resume with an edited
exclude file is refused."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from vit_ft.data.datasets import load_image_datasets
from vit_ft.data.digits import write_digits_imagefolder
from vit_ft.data.exclusions import FINDINGS_COLUMNS, RELABEL_COLUMNS, apply_exclusions, read_exclusions
from vit_ft.utils.cli import error_line

from ..cli_runner import run_script
from ..conftest import write_tiny_recipe


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Digits 0, 1, 2: 12 training images each."""
    tmp = tmp_path_factory.mktemp("exclusions")
    digits = write_digits_imagefolder(tmp / "digits")
    root = tmp / "small"
    for split, count in (("train", 12), ("test", 4)):
        for digit in "012":
            (root / split / digit).mkdir(parents=True)
            for path in sorted((digits / split / digit).iterdir())[:count]:
                shutil.copy(path, root / split / digit / path.name)
    return root


def write_csv(path: Path, columns, rows) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(rows)
    return path


def loaded(folder: Path, validation: float = 0.25):
    return load_image_datasets(train_dir=folder / "train", test_dir=folder / "test",
                               validation_split_percentage=validation, seed=0)  # fmt: skip


def test_findings_drop_and_relabel_rows_change_the_training_and_validation_images(folder, tmp_path):
    splits, names = loaded(folder)
    train_paths = [image["path"] for image in splits["train"].cast_column("image", _undecoded())["image"]]
    held_paths = [image["path"] for image in splits["validation"].cast_column("image", _undecoded())["image"]]
    relabel = write_csv(tmp_path / "relabel.csv", RELABEL_COLUMNS, [
        [train_paths[0], "drop", "", "0", "leak", "1.0"],
        [train_paths[1], "relabel", "2", "0", "label_issue", "0.9"],
        [train_paths[2], "keep", "1", "0", "label_issue", "0.8"],
        [held_paths[0], "drop", "", "1", "outlier", "3.0"],  # held out of the training folder: audited too
    ])  # fmt: skip
    before = {split: list(ds["label"]) for split, ds in splits.items()}
    changed, record = apply_exclusions(dict(splits), names, read_exclusions(relabel))
    assert record["dropped"] == 2 and record["relabelled"] == 1 and len(record["sha256"]) == 64
    assert len(changed["train"]) == len(splits["train"]) - 1
    assert len(changed["validation"]) == len(splits["validation"]) - 1
    assert len(changed["test"]) == len(splits["test"])  # never changed
    assert list(changed["train"]["label"]) == [names.index("2"), *before["train"][2:]]
    # findings.csv: every image it names is dropped, whatever its kind
    findings = write_csv(tmp_path / "findings.csv", FINDINGS_COLUMNS,
                         [[train_paths[1], "label_issue", "0.9", "0", "2", ""], [train_paths[3], "leak", "1", "", "", "x"]])  # fmt: skip
    changed, record = apply_exclusions(dict(splits), names, read_exclusions(findings))
    assert record["dropped"] == 2 and record["relabelled"] == 0 and len(changed["train"]) == len(splits["train"]) - 2


def _undecoded():
    import datasets

    return datasets.Image(decode=False)


BAD = {
    "unknown file": ([["{elsewhere}", "drop", "", "0", "leak", "1"]], "names 1 image(s) the training data does not hold"),
    "unknown class": ([["{train0}", "relabel", "7", "0", "label_issue", "1"]], "relabels images to ['7'], which are not classes"),
    "no label": ([["{train0}", "relabel", "", "0", "label_issue", "1"]], "relabels {train0} to no label"),
    "bad action": ([["{train0}", "delete", "", "0", "leak", "1"]], "has action 'delete'; use one of drop, relabel, keep"),
    "no path": ([["", "drop", "", "0", "leak", "1"]], "line 2 has no path"),
    "all dropped": (None, "drops every training image"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_a_bad_exclude_file_is_one_line_that_names_the_fix(folder, tmp_path, case):
    splits, names = loaded(folder, validation=0)
    paths = [image["path"] for image in splits["train"].cast_column("image", _undecoded())["image"]]
    rows, words = BAD[case]
    values = {"elsewhere": str(tmp_path / "other.png"), "train0": paths[0]}
    rows = [[p, "drop", "", "0", "leak", "1"] for p in paths] if rows is None else rows
    exclude = write_csv(tmp_path / "relabel.csv", RELABEL_COLUMNS, [[c.format(**values) for c in r] for r in rows])
    with pytest.raises(ValueError) as raised:
        apply_exclusions(dict(splits), names, read_exclusions(exclude))
    line = error_line(raised.value)
    assert "\n" not in line and words.format(**values) in line, line


def test_a_file_that_is_not_an_audit_file_is_refused(tmp_path):
    (tmp_path / "labels.csv").write_text("file,labels\na.png,1\n")
    with pytest.raises(ValueError, match="pass vit-ft audit's findings.csv"):
        read_exclusions(tmp_path / "labels.csv")
    with pytest.raises(FileNotFoundError):
        read_exclusions(tmp_path / "missing.csv")


@pytest.mark.slow
def test_the_fine_tune_applies_records_and_guards_the_exclude_file_on_resume(folder, tmp_path, capfd):
    paths = sorted(str(p) for p in (folder / "train" / "0").iterdir())
    exclude = write_csv(tmp_path / "relabel.csv", RELABEL_COLUMNS,
                        [[paths[0], "drop", "", "0", "leak", "1"], [paths[1], "relabel", "1", "0", "label_issue", "1"]])  # fmt: skip
    recipe = write_tiny_recipe(tmp_path, train_dir=str(folder / "train"), test_dir=str(folder / "test"),
                               max_train_samples=None, max_eval_samples=None, num_train_epochs=1,
                               per_device_train_batch_size=8, save_strategy="steps", save_steps=2, eval_strategy="no",
                               load_best_model_at_end=False, exclude=str(exclude))  # fmt: skip
    ran = run_script("scripts/finetune.py", ["--recipe", str(recipe)], capfd, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    record = json.loads((tmp_path / "out" / "vit_ft_run.json").read_text())
    applied = record["data"]["exclude_applied"]
    assert applied["dropped"] == 1 and applied["relabelled"] == 1 and applied["file"] == str(exclude.resolve())
    # the same path, edited: other data, refused on resume in one line
    checkpoint = sorted((tmp_path / "out").glob("checkpoint-*"))[0]
    interrupted = tmp_path / "interrupted"
    shutil.copytree(checkpoint, interrupted / checkpoint.name)
    write_csv(exclude, RELABEL_COLUMNS, [[paths[0], "drop", "", "0", "leak", "1"]])
    ran = run_script("scripts/finetune.py", ["--recipe", str(recipe), "--output_dir", str(interrupted), "--resume"],
                     capfd, cwd=tmp_path)  # fmt: skip
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode == 1 and lines[-1].startswith("error: --resume from"), ran.stderr[-3000:]
    assert "exclude data differs" in lines[-1]
    # an exclude file naming files of other data: one line, before any training
    write_csv(exclude, RELABEL_COLUMNS, [[str(tmp_path / "nowhere.png"), "drop", "", "0", "leak", "1"]])
    ran = run_script("scripts/finetune.py", ["--recipe", str(recipe), "--output_dir", str(tmp_path / "again")],
                     capfd, cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 1 and "names 1 image(s) the training data does not hold" in ran.stderr.strip().splitlines()[-1]
