"""bf16 on a CPU without native bf16 products, as a user on an AVX2-only host runs it (VIT_FT_NO_NATIVE_BF16=1
gives any CPU that host's answer, `utils.hardware.onednn_bf16_supported`): the fine-tune and evaluate each give a
result and one warning line naming the measured slowdown, never a traceback; the run record keeps the decision."""

import json

from vit_ft.utils import hardware

from ..cli_runner import run_script
from ..conftest import write_tiny_recipe

NO_NATIVE = {hardware.NO_NATIVE_BF16_ENV: "1"}


def compute_lines(ran) -> list[str]:
    return [line for line in (ran.stdout + ran.stderr).splitlines() if "Compute: " in line]


def test_bf16_finetune_and_evaluate_run_emulated_with_one_warning_each(tmp_path, capfd):
    recipe = write_tiny_recipe(tmp_path, max_train_samples=32, max_eval_samples=16, num_train_epochs=1)
    args = ["--recipe", recipe, "--bf16", "true", "--use_cpu", "true"]
    ran = run_script("scripts/finetune.py", args, capfd, cwd=tmp_path, env=NO_NATIVE)
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr[-4000:]
    (line,) = compute_lines(ran)
    assert "bf16 on cpu" in line and f"about {hardware.EMULATED_BF16_SLOWDOWN} slower" in line, line
    record = json.loads((tmp_path / "out" / "vit_ft_run.json").read_text())["compute"]
    assert record["emulated_bf16"] and record["kernels"] == hardware.EMULATED_BF16, record

    report = tmp_path / "report"
    args = ["--model", tmp_path / "out", "--output_dir", report, "--bf16", "true"]
    ran = run_script("scripts/evaluate_model.py", args, capfd, cwd=tmp_path, env=NO_NATIVE)
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr[-4000:]
    (line,) = compute_lines(ran)
    assert "bf16 on cpu" in line and "--bf16 false runs float32" in line, line
    assert json.loads((report / "metrics.json").read_text())["bf16"] is True
