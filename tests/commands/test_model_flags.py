"""vit_ft.commands.model_flags: the model a command is given is checked before anything loads. A mistyped local
folder is one line naming the closest one (no Hub lookup, no retries); a Hub id is asked about once, without
huggingface_hub's retries; an unfinished fine-tune folder names its lock holder or last complete checkpoint."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vit_ft.commands.model_flags import UnfinishedModelFolder, check_model
from vit_ft.commands.model_flags import model_flags as flags_of
from vit_ft.utils.cli import error_line
from vit_ft.utils.lock import output_lock

from ..conftest import REPO
from ..fake_hub import FakeHub


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A working folder with a finished model folder outputs/digits, and an unfinished run outputs/run."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs" / "digits").mkdir(parents=True)
    (tmp_path / "outputs" / "digits" / "model.safetensors").write_bytes(b"")
    (tmp_path / "outputs" / "run" / "checkpoint-5").mkdir(parents=True)
    return tmp_path


@pytest.mark.parametrize(
    "model, error, message",
    [
        ("outputs/digitz", FileNotFoundError, r"^--model outputs/digitz: no such folder; did you mean outputs/digits\?$"),
        ("./outputs/digitz", FileNotFoundError, r"did you mean \./outputs/digits\?$"),
        ("outputs/digits/best", FileNotFoundError, r"^--model outputs/digits/best: no such folder; pass a model folder"),
        ("outputs/x/y", FileNotFoundError, r"no such folder; pass a model folder"),  # two slashes: a path
        ("../no-such-model", FileNotFoundError, r"no such folder; pass a model folder"),
        ("{tmp}/outputs/digit", FileNotFoundError, r"did you mean .*/outputs/digits\?$"),
        ("outputs/run", UnfinishedModelFolder,
         r"^--model outputs/run: the fine-tune there did not finish \(no model\.safetensors, no complete checkpoint\)"),
    ],
)  # fmt: skip
def test_a_bad_local_model_is_one_line_naming_the_fix(here, monkeypatch, model, error, message):
    asked = []
    monkeypatch.setattr("huggingface_hub.file_download.get_hf_file_metadata", lambda *a, **k: asked.append(a))
    with pytest.raises(error, match=message) as caught:
        check_model(model.format(tmp=here))
    assert asked == []  # a path is never looked up on the Hub
    line = error_line(caught.value)
    assert line.startswith("error: ") and "\n" not in line and "Error" not in line


def test_a_namespace_that_is_no_folder_here_is_a_hub_id_asked_once_without_retries(here, monkeypatch):
    """No network: one HEAD request, then one line (huggingface_hub alone retries five times per file)."""
    from httpx2 import ConnectError
    from huggingface_hub import constants

    asked = []

    def unreachable(url, **kwargs):
        asked.append(url)
        raise ConnectError("[Errno -2] Name or service not known")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr("huggingface_hub.file_download.get_hf_file_metadata", unreachable)
    with pytest.raises(ConnectionError, match=r"^--model me/vit-dogz: no such folder here, and the Hub .* cannot be "
                       r"reached .*This needs the network: connect, or pass a local model folder\.$"):  # fmt: skip
        check_model("me/vit-dogz")
    assert len(asked) == 1 and asked[0].endswith("/me/vit-dogz/resolve/main/config.json")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # offline: nothing in the Hub cache is the answer
    with pytest.raises(FileNotFoundError, match=r"^--model me/vit-dogz: no such folder, and offline mode"):
        check_model("me/vit-dogz")
    assert len(asked) == 1
    snapshot = Path(constants.HF_HUB_CACHE) / "models--me--vit-dogz" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)  # cached: offline mode can load it, so it passes, and is not asked about
    try:
        check_model("me/vit-dogz")
    finally:
        shutil.rmtree(snapshot.parents[1])
    assert len(asked) == 1


def test_an_unfinished_run_names_its_lock_holder(here):
    holder = rf"a fine-tune is still writing there \(pid {os.getpid()} on .*finetune started .*\); wait for it to end\.$"
    with output_lock(here / "outputs" / "run", "finetune"), pytest.raises(UnfinishedModelFolder, match=holder):
        check_model("outputs/run")


def test_an_unfinished_run_names_its_last_checkpoint_and_resume(here, monkeypatch):
    (here / "outputs" / "run" / "vit_ft_run.json").write_text('{"recipe": "digits", "finished": false}')
    monkeypatch.setattr("vit_ft.training.checkpoints.newest_complete_checkpoint", lambda f: f"{f}/checkpoint-5")
    with pytest.raises(UnfinishedModelFolder) as caught:
        check_model("outputs/run")
    assert str(caught.value) == (
        "--model outputs/run: the fine-tune there did not finish (no model.safetensors); continue it with vit-ft "
        "finetune --recipe digits --output_dir outputs/run --resume, or pass --model outputs/run/checkpoint-5 (its "
        "last complete checkpoint)."
    )


def test_a_finished_folder_and_a_plain_folder_pass(here):
    check_model("outputs/digits")
    (here / "converted").mkdir()  # no run of ours: left to the loader, which names what is missing
    check_model("converted")


@pytest.mark.parametrize(
    "argv, found",
    [
        (["--model", "a", "x.png"], [("--model", "a")]),
        (["--model=a/b", "--output", "p"], [("--model", "a/b")]),
        (["--recipe", "digits", "--model_name_or_path", "m"], []),  # checked with the recipe (pretrain_if_missing)
        (["--model"], []),  # the parser reports the missing value
        (["--models", "a"], []),
    ],
)
def test_model_flags(argv, found):
    assert flags_of(argv) == found


def test_transformers_leading_error_is_not_doubled():
    line = error_line(OSError("Error no file named model.safetensors found in directory outputs/run."))
    assert line == "error: no file named model.safetensors found in directory outputs/run."


def test_vit_ft_command_fails_on_a_mistyped_folder_before_any_network_call_or_torch(tmp_path):
    """The process boundary is the point: `vit-ft predict` with the network allowed (HF_HUB_OFFLINE unset, a
    Hub that records every request) answers with one line, asks the Hub nothing and never imports torch."""
    (tmp_path / "outputs" / "digits").mkdir(parents=True)
    probe = (
        "import sys, runpy\n"
        "sys.argv = ['vit-ft', 'predict', '--model', 'outputs/digitz', '--output', 'p.csv', 'x.png']\n"
        "try:\n    runpy.run_module('vit_ft', run_name='__main__')\n"
        "finally:\n    print('torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    with FakeHub() as hub:
        env = {**hub.env(tmp_path, token=None), "PYTHONPATH": str(REPO)}
        ran = subprocess.run(
            [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
    assert ran.returncode == 1, ran.stderr
    assert ran.stderr == "error: --model outputs/digitz: no such folder; did you mean outputs/digits?\n"
    assert ran.stdout == "False False\n"
    assert hub.calls == []


OFFLINE_CASES = [  # (command line, the path the one line names); outputs/ does not exist in these cases
    (["predict", "--model", "outputs/digitz", "--output", "p.csv", "x.png"], "--model outputs/digitz"),
    (["predict", "--model", "./digitz", "--output", "p.csv", "x.png"], "--model ./digitz"),
    (["evaluate", "--model", "~/no-such-vit-ft-model", "--output_dir", "r"], "--model ~/no-such-vit-ft-model"),
    (["export", "--model", "/no/such/model", "--output_dir", "e"], "--model /no/such/model"),
    (["inspect", "--model", "digitz", "--output_dir", "i", "x.png"], "--model digitz"),
    (["fewshot", "--model", "me/vit-nowhere", "--dataset", "d", "--output_dir", "f"], "--model me/vit-nowhere"),
    (["audit", "--model", "outputs/digitz", "--dataset", "d", "--output_dir", "a"], "--model outputs/digitz"),
]


@pytest.mark.parametrize("offline", ["1", None], ids=["HF_HUB_OFFLINE=1", "online"])
@pytest.mark.parametrize("argv, named", OFFLINE_CASES, ids=[case[0][0] for case in OFFLINE_CASES])
def test_a_model_that_is_nowhere_is_one_line_naming_it_offline_or_not(tmp_path, argv, named, offline):
    """Issue 45: with HF_HUB_OFFLINE=1 (how clusters run) `vit-ft predict --model outputs/digitz` took 11 s and
    ended in transformers' "couldn't connect". A name that is no folder here and (offline) nothing in the Hub
    cache, or (online) that the Hub, here unreachable, cannot be asked about, is one line naming it, exit 1."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(PYTHONPATH=str(REPO), HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT="http://127.0.0.1:9")  # refused
    if offline:
        env["HF_HUB_OFFLINE"] = offline
    started = time.perf_counter()
    ran = subprocess.run(
        [sys.executable, "-m", "vit_ft", *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    seconds = time.perf_counter() - started
    lines = ran.stderr.splitlines()
    assert ran.returncode == 1 and len(lines) == 1, ran.stderr[-3000:]
    assert lines[0].startswith(f"error: {named}: no such folder"), lines[0]
    assert seconds < 5, seconds  # about 0.3 s unloaded: no torch, no transformers, no retries
