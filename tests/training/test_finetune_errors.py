"""scripts/finetune.py as a user meets it: each mistake is one line `error: ...`, exit 1, no traceback, and
nothing the user had (the recipe, a finished run's model) changes. Most cases fail in argument validation,
before any data or model loads; they run the script in this process through `tests.cli_runner.run_script`
(the same script file, arguments, working folder and environment, without a fresh interpreter's imports), as
does the refused finished run. The cases that need a process of their own (IN_A_PROCESS) run as subprocesses,
as do the tests of a resume and of Ctrl-C below: the command line itself stays tested."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from vit_ft.training.checkpoints import checkpoint_is_complete
from vit_ft.utils.run_record import RUN_RECORD_FILE, is_finished

from ..cli_runner import run_script
from ..conftest import REPO, run_finetune_script, write_tiny_recipe

# id -> (extra arguments, where {tmp} is the case folder, extra environment, expected words in the error)
CASES = {
    "empty recipe": (["--recipe", "{tmp}/empty.yaml"], {}, "the recipe is empty"),
    "zero epochs": (["--num_train_epochs", "0"], {}, "train nothing"),
    "negative learning rate": (["--learning_rate", "-0.1"], {}, "learning_rate=-0.1 must be positive"),
    "image size 0": (["--image_size", "0"], {}, "image_size=0 must be a positive"),
    "image size too large": (["--image_size", "4096"], {}, "VIT_FT_MAX_IMAGE_TOKENS="),
    "processes not joined": ([], {"WORLD_SIZE": "2"}, "--use_cpu true"),
    "push offline": (
        ["--push_to_hub", "true"],
        {"HF_HUB_OFFLINE": "1"},
        "--push_to_hub is set but the Hub is offline",
    ),
    "missing train folder": (["--train_dir", "{tmp}/nowhere"], {}, "nowhere' is not a directory"),
    "one class": (["--train_dir", "{tmp}/one_class"], {}, "a classifier needs at least two"),
    "flat train folder": (["--train_dir", "{tmp}/flat"], {}, "images must sit directly in class sub-folders"),
    "output_dir is a file": (["--output_dir", "{tmp}/tiny.yaml"], {}, "is a file, not a folder"),
    "resume without checkpoint": (["--resume"], {}, "no complete checkpoint-* folder"),
    "builtin data replaced": (
        ["--recipe", "digits", "--train_dir", "{tmp}/my/train", "--validation_dir", "{tmp}/my/val"],
        {},
        "my/train' is not a directory",
    ),
}
# a real process each: WORLD_SIZE shapes accelerate's process-wide state (not undone in this process), and
# huggingface_hub reads HF_HUB_OFFLINE when it is imported
IN_A_PROCESS = ("processes not joined", "push offline")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """scripts/finetune.py with `env` added to this process's environment."""
    return run_finetune_script(*args, cwd=cwd, env={**os.environ, **(env or {})})


def assert_one_line_error(result, expected: str) -> None:
    """`result`: a subprocess.CompletedProcess or a cli_runner.Ran."""
    last = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert last.startswith("error: ") and expected in last, last


def prepare_case(tmp: Path, shared: Path) -> Path:
    """A case folder: the tiny recipe (sharing one digits folder and backbone), an empty recipe, bad folders."""
    tmp.mkdir()
    for name in ("backbone", "digits"):
        (tmp / name).symlink_to(shared / name)
    recipe = write_tiny_recipe(tmp)
    (tmp / "empty.yaml").write_text("# an empty recipe\n")
    one_class = shared / "digits" / "train" / "3"
    (tmp / "one_class").mkdir()
    shutil.copytree(one_class, tmp / "one_class" / "3")
    (tmp / "flat").mkdir()
    for image in sorted(one_class.glob("*.png"))[:2]:
        shutil.copy(image, tmp / "flat" / image.name)
    return recipe


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """One tiny recipe's digits folder and backbone, which every case folder links to."""
    shared = tmp_path_factory.mktemp("finetune_errors") / "shared"
    shared.mkdir()
    write_tiny_recipe(shared)
    return shared


def case_arguments(case: str, tmp: Path, shared: Path) -> tuple[list[str], dict[str, str], Path]:
    """The case's folder made: (its arguments, its extra environment, its recipe)."""
    args, env, _ = CASES[case]
    recipe = prepare_case(tmp, shared)
    args = [arg.replace("{tmp}", str(tmp)) for arg in args]
    if "--recipe" not in args:
        args = ["--recipe", str(recipe), *args]
    return args, env, recipe


@pytest.fixture(scope="module")
def processes(shared) -> dict[str, tuple[subprocess.CompletedProcess, Path, str]]:
    """The IN_A_PROCESS cases run as subprocesses, at once: {id: (result, recipe, recipe digest before)}."""
    jobs = {}
    for i, case in enumerate(IN_A_PROCESS):
        tmp = shared.parent / f"case{i}"
        args, env, recipe = case_arguments(case, tmp, shared)
        jobs[case] = (args, tmp, env, recipe, digest(recipe))
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {case: pool.submit(run, args, tmp, env) for case, (args, tmp, env, _, _) in jobs.items()}
        return {case: (futures[case].result(), job[3], job[4]) for case, job in jobs.items()}


@pytest.mark.parametrize("case", list(CASES))
def test_a_mistake_is_one_line_and_changes_nothing(request, shared, tmp_path, capfd, case):
    if case in IN_A_PROCESS:
        result, recipe, before = request.getfixturevalue("processes")[case]
    else:
        args, env, recipe = case_arguments(case, tmp_path / "case", shared)
        before = digest(recipe)
        result = run_script("scripts/finetune.py", args, capfd, cwd=tmp_path / "case", env=env)
    assert_one_line_error(result, CASES[case][2])
    assert digest(recipe) == before
    assert not (recipe.parent / "out" / "model.safetensors").exists()


def test_a_finished_run_is_refused_and_kept_byte_for_byte(tiny_finetuned_dir, capfd):
    out = tiny_finetuned_dir
    assert is_finished(out)
    files = [
        out / "model.safetensors",
        out / "vit_ft_run.json",
        *sorted(out.glob("checkpoint-*/model.safetensors")),
    ]
    before = {path: digest(path) for path in files}
    result = run_script(
        "scripts/finetune.py", ["--recipe", str(out.parent / "tiny.yaml")], capfd, cwd=out.parent
    )
    assert_one_line_error(result, "holds a finished run")
    # a finished run has nothing to resume: the line does not advise --resume
    assert "--overwrite_output_dir" in result.stderr and "--resume" not in result.stderr
    assert {path: digest(path) for path in files} == before


@pytest.mark.long
def test_resume_falls_back_from_a_checkpoint_whose_weights_do_not_load(tiny_finetuned_dir, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(tiny_finetuned_dir, out)
    (out / RUN_RECORD_FILE).unlink()  # a run killed after its last checkpoint: a finished one has nothing to resume
    checkpoints = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert len(checkpoints) >= 2
    newest, good = checkpoints[-1], checkpoints[-2]
    weights = newest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])  # cut short, trainer_state.json intact
    assert not checkpoint_is_complete(newest) and checkpoint_is_complete(good)
    recipe = tiny_finetuned_dir.parent / "tiny.yaml"
    result = run(["--recipe", str(recipe), "--output_dir", str(out), "--resume"], cwd=tmp_path)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    assert f"{newest.name} cannot be resumed from: its weights model.safetensors cannot be loaded" in log
    assert (out / f"incomplete-{newest.name}").is_dir()
    assert is_finished(out) and checkpoint_is_complete(good)


@pytest.mark.long
def test_ctrl_c_names_the_last_checkpoint_and_resume_finishes(tmp_path):
    """Ctrl-C (SIGINT) in the middle of training: exit 130 and one line naming the last complete checkpoint,
    from which --resume then finishes the run."""
    recipe = write_tiny_recipe(
        tmp_path,
        num_train_epochs=20,
        save_strategy="steps",
        save_steps=2,
        max_train_samples=32,
        eval_strategy="no",
    )
    out = tmp_path / "out"
    with (tmp_path / "log.txt").open("w") as log:  # a file, not a pipe nobody reads while the run goes on
        process = subprocess.Popen(
            [sys.executable, str(REPO / "scripts" / "finetune.py"), "--recipe", str(recipe)],
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.PIPE,
            text=True,
            # Ctrl-C's default action, even when this test runs as a background job (a non-interactive shell
            # starts those with SIGINT ignored, the child would inherit that and Python would then never raise
            # KeyboardInterrupt)
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None:
            if any(checkpoint_is_complete(c) for c in out.glob("checkpoint-*")):
                break
            time.sleep(0.2)
        assert process.poll() is None, "the run ended before its first checkpoint"
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    named = re.search(
        r"the last complete checkpoint is (\S+/checkpoint-\d+)\. Run the same command with --resume", last
    )
    assert last.startswith("error: interrupted") and named, last
    assert checkpoint_is_complete(named.group(1)) and not is_finished(out)
    result = run(["--recipe", str(recipe), "--resume"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert is_finished(out)
