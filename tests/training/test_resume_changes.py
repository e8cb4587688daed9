"""`--resume` when something changed since the checkpoint (vit_ft.training.resume): a finished run is left alone
(one line, exit 0, every file as it was); a change the allow-list permits is applied and stated in one line;
anything else the weights depend on is refused in one line naming each field old -> new, before any step, with
the folder unchanged. One tiny fine-tune per module; each case resumes a copy of its mid-run checkpoint."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from transformers import ViTModel

from vit_ft.arguments.recipes import build_plan
from vit_ft.training.checkpoints import CHECKPOINT_RECORD, SETTINGS_KEY, checkpoint_is_complete
from vit_ft.training.resume import FREE, GROW
from vit_ft.training.stages import run_finetune
from vit_ft.utils.run_record import is_finished, read_run_record

from ..cli_runner import run_script
from ..conftest import randomize, tiny_hf_config, write_tiny_recipe

# 32 images in batches of 8: 4 steps an epoch, 8 in all; a checkpoint and an evaluation every 3 steps, so that
# checkpoint-3 is in the middle of the first epoch
SETTINGS = {
    "max_train_samples": 32,
    "max_eval_samples": 16,
    "per_device_train_batch_size": 8,
    "per_device_eval_batch_size": 16,
    "save_strategy": "steps",
    "save_steps": 3,
    "eval_strategy": "steps",
    "eval_steps": 3,
    "load_best_model_at_end": False,
    "save_total_limit": None,
}
CHECKPOINT = "checkpoint-3"


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file under `folder`: its SHA-256 and modification time (ns)."""
    return {
        str(path.relative_to(folder)): (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


class Run:
    """The module's fine-tune (finished, in `root/out`) and the folders its cases need."""

    def __init__(self, root: Path):
        self.root = root
        self.recipe = write_tiny_recipe(root, **SETTINGS)
        result = run_script("scripts/finetune.py", ["--recipe", str(self.recipe)], None, cwd=root)
        assert result.returncode == 0, result.stderr[-4000:]
        self.finished = root / "out"
        assert is_finished(self.finished) and checkpoint_is_complete(self.finished / CHECKPOINT)
        digits = root / "digits"
        # the same ten classes, other images; and three classes only
        self.other_images = digits / "test"
        self.other_classes = root / "three"
        for name in ("0", "1", "2"):
            shutil.copytree(digits / "train" / name, self.other_classes / name)
        self.other_model = root / "other_backbone"
        randomize(ViTModel(tiny_hf_config()), seed=5).save_pretrained(self.other_model)

    def interrupted(self, tmp: Path) -> Path:
        """An output folder holding only the mid-run checkpoint, as a run killed after it leaves it."""
        out = tmp / "out"
        out.mkdir()
        shutil.copytree(self.finished / CHECKPOINT, out / CHECKPOINT)
        return out

    def finetune(self, capfd, *args: str):
        return run_script("scripts/finetune.py", ["--recipe", str(self.recipe), *args], capfd, cwd=self.root)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    return Run(tmp_path_factory.mktemp("resume_changes"))


def error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert lines and lines[-1].startswith("error: "), result.stderr[-3000:]
    return lines[-1]


def test_resuming_a_finished_run_changes_nothing(run, tmp_path, capfd):
    out = tmp_path / "out"
    shutil.copytree(run.finished, out, copy_function=shutil.copy2)
    before = snapshot(out)
    for extra in ([], ["--train_dir", str(run.other_images)]):  # other data: still nothing to resume
        result = run.finetune(capfd, "--output_dir", str(out), "--resume", *extra)
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
        lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
        assert lines == [f"{out}: the run already finished, nothing to resume (its files are kept as they are). "
                         "To train it again, pass --overwrite_output_dir without --resume, or another --output_dir."]
        assert snapshot(out) == before
    # from Python: the same, and the metrics the finished run recorded
    plan = build_plan(["--recipe", str(run.recipe), "--output_dir", str(out), "--resume_from_checkpoint", "last"])
    assert run_finetune(plan) == read_run_record(out)["metrics"] and snapshot(out) == before
    # without --resume it is refused, and nothing advises --resume for it
    line = error_line(run.finetune(capfd, "--output_dir", str(out)))
    assert "holds a finished run" in line and "--overwrite_output_dir" in line and "--resume" not in line
    assert snapshot(out) == before


# id -> (flags, the words of the refusal)
REFUSED = {
    "learning rate": (["--learning_rate", "0.001"], "learning_rate 0.003 -> 0.001"),
    "schedule": (["--lr_scheduler_type", "cosine"], "lr_scheduler_type 'linear' -> 'cosine'"),
    "warmup": (["--warmup_steps", "2"], "warmup_steps 0 -> 2"),
    "optimizer": (["--optim", "sgd"], "optim 'adamw_torch' -> 'sgd'"),
    "weight decay": (["--weight_decay", "0.01"], "weight_decay 0.0 -> 0.01"),
    "seed": (["--seed", "1"], "seed 0 -> 1"),
    "image size": (["--image_size", "16"], "image_size 32 -> 16"),
    "batch size": (["--per_device_train_batch_size", "4"], "per_device_train_batch_size 8 -> 4"),
    "augmentation": (["--auto_augment", "randaugment"], "auto_augment null -> 'randaugment'"),
    "lora": (["--use_lora", "true"], "use_lora false -> true"),
    "model": (["--model_name_or_path", "{other_model}"], "model_name_or_path '{backbone}' -> '{other_model}'"),
    "data": (["--train_dir", "{other_images}"], "train data differs (fingerprint "),
    "classes": (["--train_dir", "{other_classes}"], "classes differ (10 -> 3, not in the new data: ['3', "),
    "fewer epochs": (["--num_train_epochs", "1"], "num_train_epochs 2.0 -> 1.0 (the checkpoint is at step 3 of 8"),
    "max_steps below the checkpoint": (["--max_steps", "2"], "max_steps -1 -> 2 (the checkpoint is at step 3 of 8"),
    "max_steps before the planned end": (["--max_steps", "6"], "max_steps -1 -> 6"),
    "two at once": (["--learning_rate", "0.001", "--seed", "1"], "learning_rate 0.003 -> 0.001; seed 0 -> 1"),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_a_change_the_weights_depend_on_is_refused_in_one_line(run, tmp_path, capfd, case):
    flags, words = REFUSED[case]
    paths = {
        "other_model": run.other_model,
        "other_images": run.other_images,
        "other_classes": run.other_classes,
        "backbone": run.root / "backbone",
    }
    flags = [flag.format(**paths) for flag in flags]
    out = run.interrupted(tmp_path)
    before = snapshot(out)
    line = error_line(run.finetune(capfd, "--output_dir", str(out), "--resume", *flags))
    assert line.startswith(f"error: --resume from {out / CHECKPOINT}: this run differs from the checkpoint's")
    assert words.format(**paths) in line, line
    if case in ("data", "classes"):
        assert f"train_dir '{run.root / 'digits' / 'train'}' -> '{flags[1]}'" in line
    assert snapshot(out) == before  # refused before any step: no file written or moved


def test_an_explicit_checkpoint_is_compared_too(run, tmp_path, capfd):
    out = run.interrupted(tmp_path)
    args = ["--output_dir", str(out), "--resume_from_checkpoint", str(out / CHECKPOINT), "--seed", "3"]
    assert "seed 0 -> 3" in error_line(run.finetune(capfd, *args))


def history(out: Path) -> list[dict]:
    return json.loads((out / "trainer_state.json").read_text())["log_history"]


def steps_after_checkpoint(out: Path, key: str) -> list[int]:
    return [entry["step"] for entry in history(out) if key in entry and entry["step"] > 3]


def recorded(out: Path, checkpoint: str) -> dict:
    return json.loads((out / checkpoint / CHECKPOINT_RECORD).read_text())[SETTINGS_KEY]["arguments"]


def checkpoint_steps(out: Path) -> list[int]:
    return sorted(int(path.name.split("-")[1]) for path in out.glob("checkpoint-*"))


# id -> (flags, the stated lines, a check that the run used the new values)
ALLOWED = {
    "logging_steps": (
        ["--logging_steps", "2"],
        ["logging_steps 1.0 -> 2"],  # TrainingArguments keeps a step count <= 1 a float (a fraction of the run)
        lambda out: steps_after_checkpoint(out, "loss") == [4, 6, 8],  # was every step
    ),
    "eval_steps": (  # save_steps goes with it (the arguments pair them)
        ["--eval_steps", "2"],
        ["eval_steps 3 -> 2", "save_steps 3 -> 2"],
        lambda out: steps_after_checkpoint(out, "eval_loss") == [4, 6, 8] and checkpoint_steps(out) == [3, 4, 6, 8],
    ),
    "save_strategy": (  # eval_strategy goes with it
        ["--save_strategy", "epoch"],
        ["eval_strategy 'steps' -> 'epoch'", "save_strategy 'steps' -> 'epoch'"],
        lambda out: steps_after_checkpoint(out, "eval_loss") == [4, 8] and checkpoint_steps(out) == [3, 4, 8],
    ),
    "dataloader_num_workers": (
        ["--dataloader_num_workers", "1"],
        ["dataloader_num_workers 0 -> 1"],
        lambda out: recorded(out, "checkpoint-6")["dataloader_num_workers"] == 1,
    ),
    "per_device_eval_batch_size": (
        ["--per_device_eval_batch_size", "4"],
        ["per_device_eval_batch_size 16 -> 4"],
        lambda out: recorded(out, "checkpoint-6")["per_device_eval_batch_size"] == 4,
    ),
    "num_train_epochs": (
        ["--num_train_epochs", "3"],
        ["num_train_epochs 2.0 -> 3.0 (the linear learning-rate schedule now runs to the new last step)"],
        lambda out: history(out)[-1]["step"] == 12,
    ),
    "max_steps": (
        ["--max_steps", "10"],
        ["max_steps -1 -> 10 (the linear learning-rate schedule now runs to the new last step)"],
        lambda out: history(out)[-1]["step"] == 10,
    ),
    "run_name": (
        ["--run_name", "second-try"],
        ["run_name null -> 'second-try'"],
        lambda out: recorded(out, "checkpoint-6")["run_name"] == "second-try",
    ),
}


@pytest.mark.parametrize("case", ALLOWED, ids=list(ALLOWED))
def test_an_allowed_change_is_applied_and_stated(run, tmp_path, capfd, case):
    flags, stated, applied = ALLOWED[case]
    assert case in FREE or case in GROW
    out = run.interrupted(tmp_path)
    result = run.finetune(capfd, "--output_dir", str(out), "--resume", *flags)
    assert result.returncode == 0, result.stderr[-4000:]
    # one line for each change, the output folder's (a copy) included, none for anything else
    lines = [line.split("resume: ", 1)[1] for line in result.stdout.splitlines() if "resume: " in line]
    assert sorted(lines) == sorted([*stated, f"output_dir '{run.finished}' -> '{out}'"]), lines
    assert is_finished(out) and applied(out), history(out)


def test_a_checkpoint_without_settings_resumes_with_a_line_saying_so(run, tmp_path, capfd):
    """A checkpoint from a vit_ft that recorded no settings: compared on trainer_state.json alone."""
    out = run.interrupted(tmp_path)
    record_path = out / CHECKPOINT / CHECKPOINT_RECORD
    record = json.loads(record_path.read_text())
    del record[SETTINGS_KEY]
    record_path.write_text(json.dumps(record))
    assert checkpoint_is_complete(out / CHECKPOINT)
    line = error_line(run.finetune(capfd, "--output_dir", str(out), "--resume", "--per_device_train_batch_size", "4"))
    assert "per_device_train_batch_size 8 -> 4" in line
    result = run.finetune(capfd, "--output_dir", str(out), "--resume", "--logging_steps", "2")
    assert result.returncode == 0, result.stderr[-4000:]
    log = result.stdout + result.stderr
    assert f"resume: {CHECKPOINT} records no settings (an older vit_ft wrote it)" in log
    assert "resume: logging_steps 1.0 -> 2" in log
    assert steps_after_checkpoint(out, "loss") == [4, 6, 8]


def test_a_streamed_run_keeps_its_number_of_workers():
    """Workers are free to change on resume, except for a stream, whose workers each read their own share of
    its shards: another number of them would read the resumed pass in another order."""
    from vit_ft.training.resume import STREAM_FIXED, compare_settings

    state = {"global_step": 4, "max_steps": 8}
    for streaming, expected in ((False, "applied"), (True, "refused")):
        old = {"arguments": {"streaming": streaming, "dataloader_num_workers": 2}, "classes": None, "data": {}}
        new = {"arguments": {"streaming": streaming, "dataloader_num_workers": 4}, "classes": None, "data": {}}
        applied, refused = compare_settings(old, new, state)
        assert (applied, refused) == ((["dataloader_num_workers 2 -> 4"], []) if expected == "applied"
                                      else ([], ["dataloader_num_workers 2 -> 4"])), streaming  # fmt: skip
    assert STREAM_FIXED <= FREE
