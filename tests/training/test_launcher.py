"""The launcher as it is (issue 45): what a user and a scheduler see of a user error under `accelerate launch`.

accelerate 1.16's one-process launcher pipes the script's stderr through and, when the script exits non-zero,
raises CalledProcessError: our one `error:` line is followed by its traceback, and the launcher exits 1 whatever
the script's status (75 after a preemption included). With `--quiet` (`-q`) it prints nothing of its own and exits
1, so the `error:` line stays the last line. These tests pin both, on a wrong flag (a parse error: no training), so
that the next change of the launcher fails here and not in a user's job; docs/fine-tuning.md states it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ..conftest import REPO

pytestmark = pytest.mark.smoke  # also run on the oldest versions of the tested range (.ci/run)

WRONG_FLAG = "error: Unknown flag '--no_such_flag'"


def _launch(tmp_path, *launcher_flags: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "accelerate.commands.launch", *launcher_flags, "--num_processes", "1", "--cpu",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        str(REPO / "scripts" / "finetune.py"), "--recipe", "digits", "--no_such_flag", "1",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_user_error_under_accelerate_launch_quiet_is_the_last_line(tmp_path):
    ran = _launch(tmp_path, "--quiet")
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode == 1, ran.stderr[-3000:]
    assert lines[-1].startswith(WRONG_FLAG) and "Traceback" not in ran.stderr, ran.stderr[-3000:]


@pytest.mark.long  # a second launch; the suite keeps the --quiet one
def test_without_quiet_the_launcher_adds_its_traceback_after_the_error_line(tmp_path):
    """What the docs tell users to avoid with `-q`; if a launcher release stops adding it, this fails: then the
    docs' advice (and this test) can go."""
    ran = _launch(tmp_path)
    lines = ran.stderr.strip().splitlines()
    ours = [i for i, line in enumerate(lines) if line.startswith(WRONG_FLAG)]
    assert ran.returncode == 1 and len(ours) == 1, ran.stderr[-3000:]
    assert lines[-1].startswith("subprocess.CalledProcessError:") and "exit status 1" in lines[-1], lines[-1]
    assert ours[0] < len(lines) - 1
