"""scripts/gpu_check.sh and its Python half (benchmarks/gpu_check.py): the CPU mode runs every step tiny and writes
one summary line per step; a missing module or a torch wheel stops it in one line; the key figures; the gpu
bench's third contender (timm's ViT) where timm is installed (stood in here: timm is not installed in CI)."""

import dataclasses
import json
import os
import subprocess
import sys
import types

import pytest
import torch

from benchmarks import gpu_check
from benchmarks.gpu import TIMM, bench_gpu

from .conftest import REPO
from .test_benchmark import tiny_settings

STEPS = ("env", "data", "loader", "dogs", "resume", "compile", "bench")


def run_check(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "OUT": str(tmp_path / "out"), "GPU_CHECK_WORK": str(tmp_path / "work"),
                   "PY": sys.executable, "OMP_NUM_THREADS": "1", **env}  # fmt: skip
    return subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), *args], env=environment,
                          capture_output=True, text=True, timeout=900)  # fmt: skip


@pytest.mark.long  # CI's own step after the suite
def test_the_cpu_mode_runs_every_step_and_writes_one_summary_line_each(tmp_path):
    """About 3 minutes on 2 busy cores (each step starts its own interpreter, torch and transformers: 10-20 s
    each here), hence slow; the same steps on a GPU are the check itself."""
    result = run_check(tmp_path, "--cpu")
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert result.returncode == 0, summary + result.stderr[-3000:]
    lines = [line for line in summary.splitlines() if line.startswith("- ")]
    assert [line.split(":")[0][2:] for line in lines] == list(STEPS), summary
    assert all(line.split(": ")[1].startswith("ok in ") for line in lines), summary
    figure = dict(line[2:].split(": ", 1) for line in lines)
    assert "/dev/shm" in figure["env"] and "torch " in figure["env"]
    assert "4 classes x 10 train" in figure["data"]
    assert "1 workers" in figure["loader"] and "2 workers" in figure["loader"]
    assert "6 steps" in figure["dogs"] and "GPU not sampled" in figure["dogs"]
    # on a CPU the resumed run is exact
    assert "6 steps" in figure["resume"] and "differs from the uninterrupted run's by 0.00e+00" in figure["resume"]
    assert "3 steps" in figure["compile"]
    assert "training MFU" in figure["bench"] and "vs transformers ViT" in figure["bench"]


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (["--gpu"], {}, "gpu_check: unknown argument '--gpu'; the only one is --cpu"),
        ([], {"torch_wheel": "1"}, "holds a torch wheel; remove it: the image's own CUDA build of torch must stay"),
        ([], {"bad_wheel": "1"}, "gpu_check: installing"),
    ],
)
def test_a_bad_set_up_stops_in_one_line(tmp_path, args, env, said):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    if "torch_wheel" in env:
        (wheels / "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"")
    if "bad_wheel" in env:
        (wheels / "datasets-5.2.0-py3-none-any.whl").write_bytes(b"not a zip")
    result = run_check(tmp_path, *args, GPU_CHECK_WHEELS=str(wheels))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and said in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("broken", "missing", "said"),
    [
        ("kornia", "kornia", "gpu_check: no module kornia: put its wheel in wheels/"),
        ("datasets", "xxhash", "gpu_check: no module xxhash (needed by datasets): put its wheel in wheels/"),
    ],
)
def test_a_missing_module_is_one_line_naming_it(monkeypatch, broken, missing, said):
    real = gpu_check.importlib.import_module

    def import_module(name):
        if name == broken:
            raise ModuleNotFoundError(f"No module named '{missing}'", name=missing)
        return real(name)

    monkeypatch.setattr(gpu_check.importlib, "import_module", import_module)
    line = gpu_check.check_modules(("json", broken, "csv"))
    assert line.startswith(said) and "\n" not in line
    assert gpu_check.check_modules(("json", "csv")) is None


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        (None, "GPU not sampled"),
        ("timestamp, memory.used [MiB], utilization.gpu [%]\n", "GPU not sampled"),
        # idle samples before and after the work are left out; memory peak over the busy span
        ("t, m, u\nA, 500, 0\nB, 20480, 90\nC, 40960, 100\nD, 30720, 80\nE, 512, 0\n",
         "GPU memory peak 40.0 GiB, utilisation mean 90% median 90% (3 samples)"),
    ],
)  # fmt: skip
def test_gpu_samples_figure(tmp_path, samples, expected):
    path = tmp_path / "dogs.gpu.csv"
    if samples is not None:
        path.write_text(samples)
    assert gpu_check.gpu_samples_figure(path).startswith(expected)


@pytest.mark.slow  # ~7 s: three contenders, eager and traced, inference and training
def test_the_gpu_bench_adds_timm_as_a_third_contender_where_it_is_installed(monkeypatch, tmp_path):
    """timm stood in by a module of the same name and constructor (a linear classifier): what is tested is our
    plumbing, the rows and the figure, not timm's speed."""

    class VisionTransformer(torch.nn.Module):
        def __init__(self, img_size, patch_size, num_classes, embed_dim, depth, num_heads, mlp_ratio, qkv_bias,
                     global_pool):  # fmt: skip
            super().__init__()
            self.head = torch.nn.Linear(3 * img_size[0] * img_size[1], num_classes)

        def forward(self, pixels):
            return self.head(pixels.flatten(1))

    module = types.ModuleType("timm.models.vision_transformer")
    module.VisionTransformer = VisionTransformer
    for name in ("timm", "timm.models"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "timm.models.vision_transformer", module)

    rows = bench_gpu(tiny_settings(rounds=2, gpu_device="cpu", sections=("gpu",)), tmp_path)
    against_timm = [row for row in rows if row.reference.startswith(TIMM)]
    assert len(rows) == 7 + 4 and len(against_timm) == 4  # eager and best, inference and training
    assert all(row.candidate_value > 0 and row.reference_value > 0 for row in against_timm)

    result = tmp_path / "benchmark.json"
    result.write_text(json.dumps({"rows": [dataclasses.asdict(row) for row in rows]}))
    figure = gpu_check.bench_figure(result)
    assert figure.count(f"vs {TIMM}") == 4 and figure.count("vs transformers ViT") == 4
