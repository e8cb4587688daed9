"""Every shell command in the README and the docs runs, as written, where it can run offline.

The commands are collected from the ```bash blocks of README.md, docs/*.md, recipes/README.md and demo/README.md.
Each is either run or skipped for a reason in SKIPPED (a rule matching it); a command that matches no rule runs,
so a new command in the docs is tested by default. They run in document order in one workspace (the digits
images, a built-in pre-training of one epoch), in-process through the command's own `main` (the script path is
checked to be the thin wrapper of that command), with flags appended only to keep them small: `--max_steps 2`
for a fine-tune, one seed and one shot for few-shot and seeds, `--quick` for the benchmark. The demo is started
as a process and must answer on its port. A renamed script, command or flag fails here before it fails a reader.
"""

from __future__ import annotations

import contextlib
import glob
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from vit_ft.utils.hardware import onednn_bf16_supported

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "recipes/README.md",
             REPO / "demo/README.md"]
HUB_RECIPES = r"--recipe (dogs|cifar10|cifar100|pets|flowers102|hymenoptera)\S*"

# (pattern, why it is not run here); the first match wins, and a command that matches none runs.
SKIPPED = [
    (r"^(python3 -m venv|\. \.venv/bin/activate|pip install)", "set-up: .ci/run runs it on a fresh machine"),
    (r"-m pytest", "the test suite itself"),
    (HUB_RECIPES, "downloads a Hub dataset and checkpoint; tests/test_headline.py runs the dogs recipes "
                  "through a local Hub"),
    (r"--recipe (my_recipe|path/to/my)\.yaml", "names a recipe file of the reader's"),
    (r"^(?!.*--local_dir).*(push_to_hub|vit-ft push|--hub_model_id)", "pushes to the Hub; tests/tools/test_hub.py "
     "pushes to a local Hub (the --local_dir form, which sends nothing, runs here)"),
    (r"--model (google|me|timm)/|uoft-cs/|--model_name_or_path \S+(/|\.npz)", "downloads from the Hub, or "
     "names a checkpoint file of the reader's"),
    (r"outputs/dogs", "needs the dogs recipe's output, which downloads its data"),
    (r"outputs/pets-", "needs the CLIP runs above it, which download; tests/tools/test_wise.py runs vit-ft wise"),
    (r"scripts/gpu_check\.sh", "the GPU check (minutes); tests/test_gpu_check.py runs its --cpu mode"),
    (r"^(vit-ft serve|python scripts/serve\.py) ", "starts a server that runs until stopped; tests/tools/test_serve.py "
     "starts one and sends it these requests"),
    (r"^curl ", "a request to a running server; tests/tools/test_serve.py sends them"),
    (r"^python demo/app\.py --model outputs/digits --host 127\.0\.0\.1 --port \d+$", "README.md's demo command with "
     "its default host and a port: the README's is started here (on a free port, as every demo command)"),
]
if not onednn_bf16_supported():  # an AVX2-only CPU: the benchmark refuses bf16 alone in one line (its own test)
    SKIPPED.append((r"--dtypes bf16( |$)", "times native bf16 products, which this CPU lacks"))


def documented_commands() -> list[tuple[str, str]]:
    """(where, command) for each command line in the documents' bash blocks, `&&` chains split, in order."""
    found: list[tuple[str, str]] = []
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        for block in re.finditer(r"```(?:bash|sh|shell)\n(.*?)```", text, re.S):
            for line in block.group(1).replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                if not line or line.startswith("#"):
                    continue
                for part in line.split("&&"):
                    part = re.sub(r"\[(--[^\]]+)\]", r"\1", part).strip()  # `[--port 7860]`: optional flags, given
                    where = f"{document.relative_to(REPO)}: {part}"
                    if part not in (command for _, command in found):
                        found.append((where, part))
    return found


def skip_reason(command: str) -> str | None:
    return next((why for pattern, why in SKIPPED if re.search(pattern, command)), None)


# commands that run several fine-tunes or timed rounds even when kept small: CI's long step runs them (`-m long`)
LONG = [
    r"scripts/bench\.py( --quick)?$",  # the benchmark's sections (tests/test_benchmark.py's quick run: the suite's)
    r"scripts/seeds\.py",  # a fine-tune per seed, each its own process (tests/training/test_seeds.py: the suite's)
    r"--method auto",  # the ladder's rungs, one after another
    r"--method (dora|vera|oft|boft|loha|lokr|adalora|ia3|ln_tuning)",  # a peft fine-tune (test_peft_methods' long)
    r"digits-(linear|lpft|wise)|--shift",  # LP-FT and WiSE-FT on digits, the corruptions' 27 passes (issue 48)
]
COMMANDS = documented_commands()
PARAMS = [
    pytest.param(where, command, id=where, marks=[pytest.mark.long] * any(re.search(p, command) for p in LONG))
    for where, command in COMMANDS
]


def test_every_document_has_commands_and_some_run():
    runnable = [command for _, command in COMMANDS if skip_reason(command) is None]
    assert len(COMMANDS) > 30 and len(runnable) > 15, (len(COMMANDS), runnable)
    for needed in ("--recipe digits", "evaluate_model.py", "predict.py", "export.py", "demo/app.py"):
        assert any(needed in command for command in runnable), needed


# One number per fact: the digits recipe's measured numbers live in one table (recipes/README.md, "digits:
# measured"), with date, host and seeds; the other pages link to it. A percentage of that table quoted in a
# paragraph about digits anywhere else (the docs, the README, the recipes' comments, the rest of recipes/README.md
# outside its digits section) is a copy that will go stale, and fails here.
MEASURED_HEADING = "### digits: measured"
PERCENT = re.compile(r"(?<![\d.])(\d{1,3}\.\d{1,2}) ?%")  # with decimals: "10 %" hold-outs are no result


def measured_table() -> list[list[str]]:
    """The cells of each row of recipes/README.md's digits table (the header and the rule left out)."""
    text = (REPO / "recipes/README.md").read_text(encoding="utf-8")
    assert MEASURED_HEADING in text, "recipes/README.md lost its measured digits table"
    after = text.split(MEASURED_HEADING, 1)[1].lstrip("\n")
    table = after[after.index("\n|") + 1 :].split("\n\n", 1)[0]  # the first table under the heading
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in table.splitlines()[2:]]


def quoted_elsewhere(measured: set[float]) -> list[str]:
    """'file:line: number' for each of the `measured` percentages quoted in a paragraph about digits (or right
    after one: a table under its sentence) outside
    the digits section of recipes/README.md (a number written with fewer decimals matches its rounding)."""
    places = []
    for document in [*DOCUMENTS, *sorted((REPO / "recipes").glob("*.yaml"))]:
        text = document.read_text(encoding="utf-8")
        if document.name == "README.md" and document.parent.name == "recipes":  # its digits section is the source
            start = text.index("## digits\n")
            end = text.index("\n## ", start + 1)
            text = text[:start] + "\n" * text[start:end].count("\n") + text[end:]
        line, previous = 1, ""
        for paragraph in re.split(r"\n(?=\s*\n)", text):  # a table is read with the paragraph before it
            about = paragraph + previous
            previous = paragraph
            if "digits" in about and "digits-multilabel" not in about:
                for match in PERCENT.finditer(paragraph):
                    decimals = len(match.group(1).split(".")[1])
                    if float(match.group(1)) in {round(value, decimals) for value in measured}:
                        at = line + paragraph[: match.start()].count("\n")
                        places.append(f"{document.relative_to(REPO)}:{at}: {match.group(0)}")
            line += paragraph.count("\n") + 1
    return places


def test_digits_numbers_come_from_one_measured_table():
    rows = measured_table()
    assert len(rows) >= 5
    for what, seeds, _result, measured, _command in rows:
        assert seeds and re.search(r"20\d\d-\d\d", measured), f"{what!r} states no seeds or date"
    numbers = {float(value) for row in rows for value in PERCENT.findall(row[2])}
    assert {98.44, 98.33, 97.44, 94.9, 97.4} <= numbers  # the seeds' means (today's, 0.7's), seed 42, few-shot ends
    assert quoted_elsewhere(numbers) == []


def test_a_digits_number_copied_out_of_its_table_is_found(monkeypatch, tmp_path):
    copy = tmp_path / "copy.md"
    copy.write_text("# A page\n\nThe digits recipe reaches 98.3 % on test.\n\nCIFAR-10:\n\n| 98.3 % |\n\n"
                    "Measured on digits:\n\n| 97.44 % |\n")
    monkeypatch.setattr(sys.modules[__name__], "DOCUMENTS", [*DOCUMENTS, copy])
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path.parent)
    found = quoted_elsewhere({98.33, 97.44})
    assert found == [f"{tmp_path.name}/copy.md:3: 98.3 %", f"{tmp_path.name}/copy.md:11: 97.44 %"]  # not CIFAR's


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A folder holding what the docs' commands read: the digits images and the one-epoch built-in pre-trainings."""
    from vit_ft.data.digits import write_digits_imagefolder
    from vit_ft.training.pretrain import pretrain_digits

    root = tmp_path_factory.mktemp("docs")
    write_digits_imagefolder(root / "data/digits", seed=0)
    pretrain_digits(root / "outputs/digits-pretrained", root / "data/digits/train", epochs=1)
    small = root / "outputs/digits-small-pretrained"  # digits-distill's student
    pretrain_digits(small, root / "data/digits/train", epochs=1, size="digits-small")
    return root  # each command runs there (`test_documented_command_runs`)


def command_main(program: list[str]):
    """(the `main(argv)` a command line runs, its arguments): scripts/X.py, vit-ft X, python -m vit_ft X."""
    import importlib

    if program[:2] == ["accelerate", "launch"]:  # one process here: the launcher's own start is tests/training's
        program = ["python", *program[2:]] if program[2] != "-m" else ["python", "-m", *program[3:]]
    if program[:2] == ["python", "-m"] and program[2].startswith("vit_ft.commands."):
        program = ["vit-ft", program[2].rsplit(".", 1)[-1], *program[3:]]
    if program[:2] == ["python", "-m"] and program[2] == "vit_ft":
        program = ["vit-ft", *program[3:]]
    if program[0] == "vit-ft":
        return importlib.import_module(f"vit_ft.commands.{program[1]}").main, program[2:]
    script = REPO / program[1]
    assert script.is_file(), f"{program[1]} does not exist"
    source = script.read_text(encoding="utf-8")
    if program[1] == "scripts/bench.py":
        from benchmarks.run import main

        assert "from benchmarks.run import main" in source
        return main, program[2:]
    wrapped = re.search(r"from vit_ft\.commands\.(\w+) import main", source)
    assert wrapped, f"{program[1]} is not a thin wrapper of a vit_ft command"
    return importlib.import_module(f"vit_ft.commands.{wrapped.group(1)}").main, program[2:]


def small(command_name: str, argv: list[str]) -> list[str]:
    """The flags that keep a documented command small, appended (later flags win)."""
    if command_name == "finetune":
        extra = ["--max_steps", "2"] + ([] if "--resume" in argv else ["--overwrite_output_dir"])
        return argv + extra
    if command_name == "seeds":
        # one seed, and the workspace's pre-training instead of one per seed
        return argv + ["--seeds", "0", "--max_steps", "2", "--model_name_or_path", "outputs/digits-pretrained"]
    if command_name == "fewshot":
        return argv + ["--shots", "1", "--seeds", "1"]
    if command_name == "run":  # benchmarks.run
        return argv + ["--quick", "--rounds", "1", "--output-dir", "outputs/benchmark"]
    return argv


def run_in_process(command: str) -> None:
    program = shlex.split(command)
    program = [program[0], *[match for arg in program[1:] for match in (sorted(glob.glob(arg)) or [arg])]]
    main, argv = command_main(program)
    argv = small(main.__module__.rsplit(".", 1)[-1], argv)
    saved_argv = sys.argv
    sys.argv = [program[1] if program[0] == "python" else program[0], *argv]
    try:
        main(argv)
    except SystemExit as stop:
        assert stop.code in (0, None), f"{command!r} exited {stop.code}"
    finally:
        sys.argv = saved_argv


def run_demo(command: str) -> None:
    """Start the demo as the reader would and wait until it answers on its port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = shlex.split(command)[2:]
    if "--port" in argv:
        argv[argv.index("--port") + 1] = str(port)
    else:
        argv += ["--port", str(port)]
    process = subprocess.Popen([sys.executable, str(REPO / "demo/app.py"), *argv], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert process.poll() is None, process.stdout.read()
            with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as answer:
                assert answer.status == 200
                return
            time.sleep(1)
        pytest.fail(f"{command!r} did not answer on port {port} within 120 s")
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.parametrize("where,command", PARAMS)
def test_documented_command_runs(where, command, workspace, capsys, monkeypatch):
    reason = skip_reason(command)
    if reason:
        pytest.skip(reason)
    monkeypatch.chdir(workspace)  # the docs' relative paths are the workspace's
    if command.startswith("python demo/app.py"):
        run_demo(command)
    else:
        run_in_process(command)
