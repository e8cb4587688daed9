"""The package as a user installs it: the built wheel, installed (not editable) into a fresh virtual environment
that cannot see the source tree, lists the built-in recipes, fine-tunes the digits recipe (made tiny by flags) and
predicts with the result, all through the `vit-ft` entry point, and `accelerate launch -m` finds the command.

The fresh environment gets torch, transformers, ... from this one (a .pth file naming this environment's
site-packages, which does not run this environment's editable-install hook), and vit_ft only from the wheel.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from setuptools import find_packages
from setuptools.config.pyprojecttoml import read_configuration
from transformers import ViTModel

from ..conftest import REPO, randomize, tiny_hf_config

BUILD_INPUTS = ("pyproject.toml", "README.md", "vit_ft", "recipes")  # what the build reads, nothing else
RECIPES = sorted(path.stem for path in (REPO / "recipes").glob("*.yaml"))


def test_the_package_list_is_every_package_of_vit_ft():
    """pyproject.toml lists the packages (recipes/ is mapped to vit_ft.recipes): one added later must be listed."""
    listed = read_configuration(REPO / "pyproject.toml")["tool"]["setuptools"]["packages"]
    found = [*find_packages(str(REPO), include=["vit_ft", "vit_ft.*"]), "vit_ft.recipes"]
    missing, extra = sorted(set(found) - set(listed)), sorted(set(listed) - set(found))
    assert not missing and not extra, f"add {missing} to / remove {extra} from [tool.setuptools] packages"


def run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built offline from a copy of what the build reads (the source tree is left untouched)."""
    tmp = tmp_path_factory.mktemp("wheel")
    (tmp / "src").mkdir()
    for name in BUILD_INPUTS:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, tmp / "src" / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(source, tmp / "src" / name)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(tmp / "dist"), str(tmp / "src")], cwd=tmp, env=dict(os.environ))  # fmt: skip
    (wheel,) = (tmp / "dist").glob("vit_ft-*.whl")
    return wheel


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A fresh virtual environment with the wheel installed, and the environment to run its commands in."""
    root = tmp_path_factory.mktemp("venv")
    run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], cwd=root, env=dict(os.environ))
    python = root / "venv" / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
         str(wheel)], cwd=root, env=dict(os.environ))  # fmt: skip
    # after the install, so that pip saw an empty environment: the dependencies, not this environment's vit_ft
    site = run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root, {}
    ).stdout
    (Path(site.strip()) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    unset = ("PYTHONPATH", "VIRTUAL_ENV", "VIT_FT_RECIPES_DIR")  # the built-in recipes, from the wheel
    env = {key: value for key, value in os.environ.items() if key not in unset}
    env |= {"PATH": f"{root / 'venv' / 'bin'}{os.pathsep}{env['PATH']}", "HF_HUB_OFFLINE": "1"}
    env |= {"HF_DATASETS_OFFLINE": "1"}
    return root / "venv", env


def test_the_wheel_holds_the_recipes_and_the_entry_point(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"vit_ft/recipes/{name}.yaml" for name in RECIPES} <= set(names)
    assert "vit_ft/recipes/accelerate_configs/cpu_2proc.yaml" in names and "vit_ft/recipes/README.md" in names
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt")))
    assert "vit-ft = vit_ft.commands:main" in entry_points.decode()


@pytest.mark.long  # a wheel built and installed in a venv of its own: CI's own step
def test_the_installed_wheel_lists_fine_tunes_and_predicts(venv, tmp_path):
    root, env = venv
    where = run(
        [str(root / "bin" / "python"), "-c", "import vit_ft, vit_ft.arguments.recipes as r; "
         "print(vit_ft.__file__); print(r.recipes_dir())"], tmp_path, env,
    ).stdout.split()  # fmt: skip
    assert all(Path(path).is_relative_to(root) for path in where), where  # the wheel's, not the source tree's

    listed = run(["vit-ft", "finetune", "--list-recipes"], tmp_path, env).stdout
    assert all(f"\n{name} " in listed for name in RECIPES), listed

    # the digits recipe by name, shrunk by flags: a tiny checkpoint (no pre-training), 96 images, one epoch
    randomize(ViTModel(tiny_hf_config())).save_pretrained(tmp_path / "backbone")
    run(["vit-ft", "finetune", "--recipe", "digits", "--model_name_or_path", str(tmp_path / "backbone"),
         "--max_train_samples", "96", "--max_eval_samples", "48", "--num_train_epochs", "1",
         "--output_dir", "out", "--report_to", "none"], tmp_path, env)  # fmt: skip
    assert (tmp_path / "out" / "model.safetensors").is_file() and (tmp_path / "data" / "digits").is_dir()

    images = sorted((tmp_path / "data" / "digits" / "test" / "7").glob("*.png"))[:3]
    run(["vit-ft", "predict", "--model", "out", *map(str, images), "--output", "preds.csv"], tmp_path, env)
    with open(tmp_path / "preds.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [row["path"] for row in rows] == [str(image) for image in images]
    assert all(row["label"] in {str(i) for i in range(10)} and not row["error"] for row in rows)


@pytest.mark.long
def test_accelerate_launch_runs_the_installed_module(venv, tmp_path):
    root, env = venv
    launch = [str(root / "bin" / "python"), "-m", "accelerate.commands.launch", "--num_processes", "1",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]  # fmt: skip
    listed = run([*launch, "-m", "vit_ft.commands.finetune", "--list-recipes"], tmp_path, env).stdout
    assert all(f"\n{name} " in listed for name in RECIPES), listed
