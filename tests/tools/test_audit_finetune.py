"""`vit-ft audit --oof finetune` (issue 46): k-fold fine-tunes as a candidate source of out-of-fold probabilities.
The fold's command line checked on the fine-tune's own run plan (family protocol, budget, method, the user's
flags last), each fold's data holding none of its held-out images, the candidate chosen by the probes' rule and
run again by the self-check, bad input as one `error:` line each; and, long, real fine-tunes end to end."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.cli_runner import run_script
from vit_ft.tasks.feature_bank import normalized
from vit_ft.tools.audit.finetune import (
    FOLD_BATCH,
    OOF_STEPS,
    FineTuner,
    OofFinetune,
    fold_finetune_probabilities,
    fold_flags,
)
from vit_ft.tools.audit.run import AuditOptions, audit_labels

pytest.importorskip("cleanlab")

NAMES = ["ant", "bee", "wasp"]  # hf_classifier_dir's labels


def image_folder(root: Path, per_class: int = 7, classes: list[str] = NAMES) -> Path:
    """root/train/<class>/<i>.png: small grey images, each class its own brightness."""
    for c, name in enumerate(classes):
        (root / "train" / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = np.full((16, 16), 40 * c + 3 * i, np.uint8)
            Image.fromarray(pixels).save(root / "train" / name / f"{i}.png")
    return root


@pytest.mark.smoke
def test_a_folds_command_line_is_the_fine_tunes_own_plan_with_the_family_protocol_and_the_users_flags_last(
    tmp_path, hf_backbone_dir
):  # fmt: skip
    from vit_ft.arguments.family_defaults import FAMILY_DEFAULTS
    from vit_ft.arguments.recipes import build_plan

    tuner = FineTuner(build_plan, lambda plan: None)
    data, out = tmp_path / "data", tmp_path / "fold"
    plan = build_plan(fold_flags(OofFinetune(tuner, "lora", 7), hf_backbone_dir, data, out, seed=3))
    model_args, data_args, training_args = plan.arguments
    vit = FAMILY_DEFAULTS["vit"].values  # the backbone is a transformers ViT: the ViT paper's protocol
    assert (model_args.method, training_args.max_steps, training_args.seed) == ("lora", 7, 3)
    assert training_args.learning_rate == vit["learning_rate"] and training_args.optim == vit["optim"]
    assert training_args.per_device_train_batch_size == FOLD_BATCH and data_args.dataset_name == str(data)
    assert training_args.eval_strategy == "no" and not training_args.load_best_model_at_end
    assert data_args.validation_split_percentage == 0 and not data_args.bank_max_images
    # the user's flags win; with a recipe, its protocol replaces the family's
    mine = build_plan(fold_flags(OofFinetune(tuner, steps=5, flags=("--learning_rate", "0.5")), hf_backbone_dir, data, out, 0))
    assert mine.training_args.learning_rate == 0.5 and mine.model_args.method == "full"
    recipe = build_plan(fold_flags(OofFinetune(tuner, flags=("--recipe", "digits")), hf_backbone_dir, data, out, 0))
    assert (recipe.training_args.optim, recipe.training_args.learning_rate) == ("adamw_torch", 1e-3)
    assert recipe.training_args.max_steps == OOF_STEPS and recipe.data_args.train_dir is None  # its data replaced


@pytest.mark.smoke
def test_each_fold_trains_on_the_other_folds_with_the_given_labels_and_predicts_its_own(tmp_path, hf_classifier_dir):
    """A stand-in fine-tune (the classifier copied to the fold's output folder) records each fold's data: no
    held-out image in its training or validation split, the labels as given (not the folder's), and every image's
    probabilities those of the model that did not train on it."""
    import datasets

    from vit_ft.tools.trained import load_trained

    root = image_folder(tmp_path / "data")
    images = [{"path": str(p), "bytes": None} for p in sorted((root / "train").glob("*/*.png"))]
    labels = np.array([NAMES.index(Path(i["path"]).parent.name) for i in images])
    labels[0] = 2  # a flipped label: the folds train on what the audit was given
    seen = []

    def run(flags: list[str]) -> None:  # each image known by its one grey value (the fold's copy holds its bytes)
        data = datasets.load_from_disk(flags[flags.index("--dataset_name") + 1])
        seen.append({split: ([int(np.asarray(image)[0, 0]) for image in d["image"]], d["label"])
                     for split, d in data.items()})  # fmt: skip
        shutil.copytree(hf_classifier_dir, flags[flags.index("--output_dir") + 1])

    oof = OofFinetune(FineTuner(lambda flags: flags, run), steps=3)
    options = AuditOptions(folds=3, seed=1, device="cpu", bf16=False, batch_size=4)
    probabilities = fold_finetune_probabilities(oof, "unused", images, labels, NAMES, 3, options)
    assert len(seen) == 3
    paths = [int(np.asarray(Image.open(i["path"]))[0, 0]) for i in images]
    for fold in seen:
        trained = [p for split in fold.values() for p in split[0]]
        assert len(trained) == len(set(trained)) and len(trained) < len(images)
        for split_paths, split_labels in fold.values():
            assert split_labels == [int(labels[paths.index(p)]) for p in split_paths]
        assert fold["validation"][0] and set(fold["validation"][0]).isdisjoint(fold["train"][0])
    held = [set(paths) - {p for split in fold.values() for p in split[0]} for fold in seen]
    assert set().union(*held) == set(paths) and sum(map(len, held)) == len(paths)  # each image held out once
    reference = load_trained(hf_classifier_dir, device="cpu")
    pixels = np.stack([reference.transform.transform_image(i).numpy() for i in images])
    import torch

    expected = reference.probabilities(torch.from_numpy(pixels)).numpy()
    np.testing.assert_allclose(probabilities, expected, atol=1e-5)


@pytest.mark.smoke
def test_the_fine_tunes_candidate_is_chosen_by_the_probes_rule_and_run_again_by_the_self_check():
    rng = np.random.default_rng(0)
    truth = np.repeat(np.arange(4), 50)
    given = truth.copy()
    flips = rng.choice(len(truth), 10, replace=False)
    given[flips] = (truth[flips] + 1) % 4
    noise = normalized(rng.normal(size=(len(truth), 8)))  # features that know nothing
    calls = []

    def finetuned(labels: np.ndarray, what: str) -> np.ndarray:  # knows the truth, whatever the labels say
        calls.append((what, labels.copy()))
        return np.where(np.eye(4)[truth] > 0, 0.94, 0.02)

    found, record, probabilities = audit_labels({"features": noise}, given, 4, extra={"finetune/full": finetuned})
    probe = record["probe"]
    assert probe["chosen"] == "finetune/full" and set(probe["candidates"]) >= {"features/logistic", "finetune/full"}
    losses = {name: c["log_loss"] for name, c in probe["candidates"].items()}
    assert min(losses, key=losses.get) == "finetune/full"
    assert {f.index for f in found} == set(flips.tolist())
    assert [what for what, _ in calls] == ["out-of-fold", "self-check"] and probe["picked_by"] == "log-loss"
    np.testing.assert_array_equal(calls[0][1], given)
    assert (calls[1][1] != given).sum() == record["quality"]["flipped"]  # the self-check's flipped copy
    # --oof_pick finetune: the fine-tunes' probabilities even where a probe's log-loss is lower
    def worse(labels: np.ndarray, what: str) -> np.ndarray:
        return np.full((len(labels), 4), 0.25)

    _, record, probabilities = audit_labels({"features": noise}, given, 4, extra={"finetune/lora": worse},
                                            pick="finetune/lora")  # fmt: skip
    losses = {name: c["log_loss"] for name, c in record["probe"]["candidates"].items()}
    assert record["probe"]["chosen"] == "finetune/lora" != min(losses, key=losses.get)
    assert record["probe"]["picked_by"] == "asked" and np.allclose(probabilities, 0.25)


@pytest.mark.parametrize(
    "case, extra, expected",
    [
        ("small_class", ["--oof", "finetune"], "fewer training images than --folds 5"),
        ("one_class", ["--oof", "finetune"], "has 1 class"),
        ("budget", ["--oof", "finetune", "--oof_steps", "0"], "--oof_steps 0 must be at least 1"),
        ("no_oof", ["--oof_steps", "20"], "--oof_steps only apply with --oof finetune"),
        ("pick", ["--oof_pick", "finetune"], "--oof_pick only apply with --oof finetune"),
        ("flags", ["--oof", "finetune", "--oof_flags", "--learning_rat 0.1"], "did you mean --learning_rate"),
    ],
)
def test_bad_oof_finetune_input_is_one_error_line_before_anything_is_written(case, extra, expected, tmp_path, capfd,
                                                                            hf_backbone_dir):  # fmt: skip
    classes = {"small_class": [*NAMES[:2], "x"], "one_class": NAMES[:1]}.get(case, NAMES)
    root = image_folder(tmp_path / "data", per_class=6, classes=classes)
    if case == "small_class":
        for path in list((root / "train" / "x").glob("*.png"))[2:]:
            path.unlink()  # 2 images, 5 folds
    out = tmp_path / "out"
    ran = run_script("scripts/audit.py", ["--model", hf_backbone_dir, "--dataset", str(root), "--output_dir", str(out),
                                          *extra], capfd, cwd=tmp_path)  # fmt: skip
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode == 1 and len(lines) == 1 and lines[0].startswith("error:"), ran.stderr[-2000:]
    assert expected in lines[0], lines[0]
    assert not out.exists()


# ---- real fine-tunes (long) ---------------------------------------------------------------------------------


@pytest.mark.long
def test_the_command_fine_tunes_each_fold_reports_the_candidate_and_shows_its_progress(tmp_path, capfd):
    """The command end to end with real fold fine-tunes of a small digits backbone: the candidate's row in the
    table and audit.json (log-loss, accuracy, time), a line per fold with its counts, the fold folders gone."""
    from benchmarks.audit import inject_faults
    from vit_ft.data.digits import write_digits_imagefolder
    from vit_ft.training.pretrain import pretrain_digits

    digits = write_digits_imagefolder(tmp_path / "digits")
    inject_faults(digits, tmp_path / "faulted", seed=0, leaks=0, noise=0)
    pretrain_digits(tmp_path / "backbone", tmp_path / "faulted" / "train", epochs=2, seed=0, progress=False)
    out = tmp_path / "audit"
    ran = run_script("scripts/audit.py", ["--model", str(tmp_path / "backbone"), "--dataset", str(tmp_path / "faulted"),
                                          "--output_dir", str(out), "--device", "cpu", "--bf16", "false", "--folds", "2",
                                          "--oof", "finetune", "--oof_steps", "4", "--oof_method", "lora"],
                     capfd, cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    shown = ran.stdout + ran.stderr
    for k in (1, 2):
        assert f"out-of-fold fine-tune fold {k}/2: lora, 4 steps on" in shown, shown[-3000:]
    assert "step 4/4" in shown
    record = json.loads((out / "audit.json").read_text())
    row = record["probe"]["candidates"]["finetune/lora"]
    assert row["seconds"] > 0 and 0 <= row["accuracy"] <= 1 and row["log_loss"] > 0
    assert record["oof_finetune"] == {"method": "lora", "steps": 4, "flags": [], "pick": "loss"}
    report = (out / "report.md").read_text()
    assert "| finetune/lora" in report and "2 fine-tunes of the model (lora, 4 steps each)" in report
    with open(out / "findings.csv", newline="") as f:
        assert list(csv.DictReader(f))  # the audit went on to its findings


@pytest.mark.long
def test_with_a_backbone_that_learned_the_flips_the_fine_tunes_find_them(tmp_path, capfd):
    """Issue 46's strong-backbone case at small size: digits with 5 % flipped labels, a backbone pre-trained on the
    faulted labels (30 epochs, where docs/tools.md's full-size figure has 60), audited with 5-fold fine-tunes of
    the digits recipe's protocol (200 steps each) picked (`--oof_pick finetune`). At full size they reach the
    issue's target, recall 0.99 at precision 0.92, where the frozen features' flags stop at recall 0.69; from this
    weaker backbone the recall holds (0.94 measured) and the precision does not (0.62: the fold fine-tunes are less
    accurate and confident learning's count overshoots, 109 flags for 72 flips), so this checks recall >= 0.9 and
    flags more likely right than wrong with a margin (precision >= 0.55)."""
    from benchmarks.audit import score

    from .test_audit import faulted_digits_backbone

    faulted, truth, backbone = faulted_digits_backbone(tmp_path, epochs=30, leaks=0, noise=0)
    out = tmp_path / "audit"
    ran = run_script("scripts/audit.py", ["--model", str(backbone), "--dataset", str(faulted),
                                          "--output_dir", str(out), "--device", "cpu", "--bf16", "false",
                                          "--oof", "finetune", "--oof_steps", "200", "--oof_pick", "finetune",
                                          "--oof_flags=--recipe digits"], capfd, cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    record = json.loads((out / "audit.json").read_text())
    assert record["probe"]["chosen"] == "finetune/full" and record["probe"]["picked_by"] == "asked"
    assert {"features/least_squares", "pixels/knn", "finetune/full"} <= set(record["probe"]["candidates"])
    found = score(out / "findings.csv", truth)["label_issue"]
    assert found["recall"] >= 0.9 and found["precision"] >= 0.55, found
