"""Shared fixtures: tiny checkpoints written by transformers' own ViT classes, never downloaded."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .fake_hub import HUB_VARIABLES

# Before transformers / huggingface_hub are imported (both read these once, at import): the suite's own Hub
# settings, whatever the user's shell exports (TRANSFORMERS_OFFLINE, HF_EVALUATE_OFFLINE, a token, an endpoint, a
# shared HF_HOME): offline, and a cache of its own, so no test reads the user's Hugging Face cache. Tests that
# talk to the Hub stand-in get their processes' environment from `FakeHub.env`, which drops these again.
for _name in HUB_VARIABLES:
    os.environ.pop(_name, None)
os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="vit-ft-tests-hf-home-")
atexit.register(shutil.rmtree, os.environ["HF_HOME"], ignore_errors=True)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One torch thread per test process (and per command a test starts, which inherits it): the suite runs one
# process per core (`-n auto`), and two OpenMP threads per process on those cores wait on each other's barrier
# (a tiny ViT's training step: about 7 ms with one thread, up to a second with two on a busy machine). Export
# OMP_NUM_THREADS to choose another count.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", os.environ["OMP_NUM_THREADS"])

from typing import TYPE_CHECKING  # noqa: E402

import pytest  # noqa: E402

# torch, transformers and vit_ft are imported where they are used: xdist's controller process loads this file
# but runs no test, and those imports (about 5 s) would come before any worker starts
if TYPE_CHECKING:
    import torch
    from transformers import ViTConfig

    from vit_ft import ViTFTConfig


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    import torch

    # if torch was imported before the variable was set
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# The files that take longest (measured: the README's test command with --durations=0, 2026-12-07), run first.
# `--dist loadfile` hands whole files to the workers in collection order, so a long file met last keeps one worker
# busy while the other idles; started first, the short files fill in around it. Order only: no test depends on it.
LONGEST_FIRST = [
    "test_docs.py", "training/test_resume.py", "tools/test_tool_errors.py", "training/test_finetune_errors.py",
    "training/test_two_processes.py", "training/test_run_safety.py", "training/test_resume_changes.py",
    "test_hermetic.py", "training/test_distillation.py", "training/test_workers.py", "tools/test_output_folders.py",
    "tools/test_family_tools.py", "model/test_export.py",
]  # fmt: skip


def pytest_collection_modifyitems(config, items):
    rank = {Path(__file__).parent / name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path, len(rank)))  # stable: each file's own order is kept


TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "image_size": 16,
    "patch_size": 4,
}


def tiny_hf_config(**overrides) -> ViTConfig:
    from transformers import ViTConfig

    return ViTConfig(**{**TINY, **overrides})


def tiny_ft_config(**overrides) -> ViTFTConfig:
    from vit_ft import ViTFTConfig

    return ViTFTConfig(**{**TINY, **overrides})


def enable_checkpointing(model: torch.nn.Module, **kwargs) -> None:
    """transformers' activation checkpointing switch: `activation_checkpointing_enable` from 5.23, its older name
    `gradient_checkpointing_enable` on 5.21-5.22 (the oldest of the tested range, constraints/oldest.txt)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs or None)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None)


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Give every parameter (LayerNorms and biases too) random values, so parity tests see them all."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    return model.eval()


TINY_PROCESSOR = {"image_mean": [0.5] * 3, "image_std": [0.25] * 3, "rescale_factor": 1 / 255, "resample": 2,
                  "size": {"height": 16, "width": 16}}  # fmt: skip


def save_tiny_classifier(path: Path, names: list[str], seed: int, **config) -> Path:
    """A randomized tiny ViTFT classifier over `names` (config overrides in `config`, e.g. problem_type) saved to
    `path` with TINY_PROCESSOR: a trained folder's layout, without training."""
    from vit_ft import ViTFTForImageClassification

    id2label = dict(enumerate(names))
    model = ViTFTForImageClassification(
        tiny_ft_config(id2label=id2label, label2id={n: i for i, n in id2label.items()}, **config)
    )
    randomize(model, seed=seed).save_pretrained(path)
    (path / "preprocessor_config.json").write_text(json.dumps(TINY_PROCESSOR))
    return path


@pytest.fixture(scope="session")
def hf_backbone_dir(tmp_path_factory) -> str:
    """A transformers ViTModel checkpoint (with pooler, no head), like google/vit-base-patch16-224-in21k."""
    from transformers import ViTModel

    path = tmp_path_factory.mktemp("hf_backbone")
    randomize(ViTModel(tiny_hf_config())).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def hf_classifier_dir(tmp_path_factory) -> str:
    """A transformers ViTForImageClassification checkpoint with three named labels."""
    from transformers import ViTForImageClassification

    path = tmp_path_factory.mktemp("hf_classifier")
    labels = ["ant", "bee", "wasp"]
    config = tiny_hf_config(id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
    randomize(ViTForImageClassification(config), seed=1).save_pretrained(path)
    return str(path)


REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _in_a_folder_of_its_own(tmp_path, monkeypatch):
    """Every test runs in its own empty working folder: what the README's first command leaves in the checkout
    (outputs/, data/), or another run's outputs, changes no result (relative paths, the path-or-Hub-id rule and
    the family defaults read the working folder)."""
    monkeypatch.chdir(tmp_path)

# The start of a script for a fresh interpreter in which `import vit_ft` fails, as on a machine that only has
# transformers: what a shared folder or Hub repo must load in.
WITHOUT_VIT_FT = """import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "vit_ft" or name.startswith("vit_ft."):
            raise ImportError("vit_ft is not installed here")
sys.meta_path.insert(0, Block())
"""


def logged_losses(output_dir: Path) -> list[tuple[int, float]]:
    """(step, training loss) of every logged step in a run's trainer_state.json."""
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    return [(entry["step"], entry["loss"]) for entry in history if "loss" in entry]


def write_tiny_recipe(tmp: Path, **overrides) -> Path:
    """A recipe on the real digits images with a tiny transformers ViTModel checkpoint: seconds on a CPU."""
    from transformers import ViTModel

    from vit_ft.data.digits import write_digits_imagefolder

    checkpoint = tmp / "backbone"
    if not checkpoint.exists():
        randomize(ViTModel(tiny_hf_config())).save_pretrained(checkpoint)
    write_digits_imagefolder(tmp / "digits")
    values = {
        "model_name_or_path": str(checkpoint),
        "image_size": 32,
        "train_dir": str(tmp / "digits" / "train"),
        "test_dir": str(tmp / "digits" / "test"),
        "max_train_samples": 96,
        "max_eval_samples": 48,
        "horizontal_flip": False,
        "crop_scale_min": 0.8,
        "optim": "adamw_torch",
        "learning_rate": 0.003,
        "num_train_epochs": 2,
        "per_device_train_batch_size": 16,
        "per_device_eval_batch_size": 48,
        "logging_steps": 1,
        "dataloader_num_workers": 0,
        "report_to": "none",
        "output_dir": str(tmp / "out"),
        "seed": 0,
        **overrides,
    }
    path = tmp / "tiny.yaml"
    path.write_text(
        "# tiny smoke recipe\n" + "\n".join(f"{k}: {json.dumps(v)}" for k, v in values.items()) + "\n"
    )
    return path


def run_repo_script(
    script: str, *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python scripts/SCRIPT ARGS` in a subprocess, as a user runs it; `env` replaces the environment."""
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def run_finetune_script(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python scripts/finetune.py ARGS` in a subprocess, as a user runs it; `env` replaces the environment."""
    return run_repo_script("finetune.py", *args, cwd=cwd, env=env)


@pytest.fixture(scope="session")
def tiny_finetuned_dir(tmp_path_factory) -> Path:
    """The output folder of a tiny real fine-tune (digits images, 2 epochs): model, processor, metrics, card."""
    from .cli_runner import run_script  # it imports this module

    tmp = tmp_path_factory.mktemp("tiny_finetune")
    # in this process (the script as `python scripts/finetune.py` runs it, without a fresh interpreter's imports)
    result = run_script("scripts/finetune.py", ["--recipe", write_tiny_recipe(tmp)], None, cwd=tmp)
    assert result.returncode == 0, result.stderr[-4000:]
    (tmp / "finetune.log").write_text(result.stdout + result.stderr)  # what the user saw, for tests of it
    return tmp / "out"
