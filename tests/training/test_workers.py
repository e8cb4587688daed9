"""DataLoader workers: `dataloader_num_workers: auto`, persistent workers and pinned memory where a GPU trains, the
shared memory the workers need (checked before training), and fine-tunes with 2 persistent workers that end
exactly where the same run without workers ends, resumed too (vit_ft.training.workers, arguments, utils.hardware).
"""

import logging
import shutil
from collections import namedtuple
from pathlib import Path

import datasets
import pytest
import torch

from vit_ft.arguments.checks import RecipeError
from vit_ft.arguments.data_loading import resolve_data_loading
from vit_ft.arguments.recipes import parse_args
from vit_ft.data.transforms import INDEX_COLUMN, build_transforms
from vit_ft.training import workers
from vit_ft.training.workers import check_data_loading, example_bytes, shared_memory_need
from vit_ft.utils import hardware

from ..conftest import write_tiny_recipe
from ..sample_images import encoded, photo
from .test_resume import SETTINGS as RESUME_SETTINGS
from .test_resume import assert_same_run, final_run, finetune

DiskUsage = namedtuple("DiskUsage", "total used free")


def cores(monkeypatch, count: int, local_processes: int | None = None) -> None:
    """This process may run on `count` cores, among `local_processes` training processes on the machine."""
    monkeypatch.setattr(hardware.os, "sched_getaffinity", lambda pid: set(range(count)), raising=False)
    if local_processes is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_processes))


@pytest.mark.parametrize(
    ("count", "local_processes", "workers_auto"),
    [(16, None, 15), (16, 1, 15), (16, 2, 7), (16, 8, 1), (2, None, 1), (1, None, 0), (4, 8, 0)],
)
def test_auto_workers_leave_a_core_of_each_process_share_to_the_main_process(
    monkeypatch, count, local_processes, workers_auto
):
    cores(monkeypatch, count, local_processes)
    assert hardware.cores_per_process() == max(1, count // (local_processes or 1))
    assert hardware.auto_dataloader_workers() == workers_auto


@pytest.mark.parametrize(
    ("values", "given", "cuda", "expected"),
    [
        # auto becomes the number; a GPU turns pinned memory on, and persistent workers when there are workers
        ({"dataloader_num_workers": "auto"}, set(), True, (7, True, True)),
        ({"dataloader_num_workers": "auto"}, set(), False, (7, False, False)),
        ({"dataloader_num_workers": 0}, set(), True, (0, True, False)),
        ({"dataloader_num_workers": 3}, set(), True, (3, True, True)),
        # what the recipe or a flag sets stays as set
        (
            {"dataloader_num_workers": 3, "dataloader_persistent_workers": False, "dataloader_pin_memory": False},
            {"dataloader_persistent_workers", "dataloader_pin_memory"},
            True,
            (3, False, False),
        ),
        ({"dataloader_num_workers": 2, "dataloader_persistent_workers": True},
         {"dataloader_persistent_workers"}, False, (2, False, True)),  # fmt: skip
        # training on the CPU although a GPU is present
        ({"dataloader_num_workers": 2, "use_cpu": True}, set(), True, (2, False, False)),
    ],
)
def test_data_loading_is_resolved_before_the_arguments_are_built(monkeypatch, values, given, cuda, expected):
    cores(monkeypatch, 16, 2)
    resolved = resolve_data_loading(values, given, cuda=cuda)
    got = (
        resolved["dataloader_num_workers"],
        resolved["dataloader_pin_memory"],
        resolved["dataloader_persistent_workers"],
    )
    assert got == expected


@pytest.mark.parametrize("where", ["flag", "recipe"])
def test_auto_workers_from_a_recipe_or_a_flag_reach_the_training_arguments_as_a_number(
    tmp_path, monkeypatch, where
):
    cores(monkeypatch, 6, None)
    recipe = write_tiny_recipe(tmp_path, **({"dataloader_num_workers": "auto"} if where == "recipe" else {}))
    flags = ["--dataloader_num_workers", "auto"] if where == "flag" else []
    _, _, training_args = parse_args(["--recipe", str(recipe), *flags])
    assert training_args.dataloader_num_workers == 5
    gpu = torch.cuda.is_available()
    assert training_args.dataloader_persistent_workers == gpu
    assert training_args.dataloader_pin_memory == gpu


@pytest.mark.parametrize(
    ("where", "value", "said"),
    [
        ("flag", "many", "invalid 'auto' or integer value: 'many'"),
        ("recipe", "many", "dataloader_num_workers='many' is not valid; it expects auto or a whole number"),
        ("flag", "-1", "dataloader_num_workers=-1 must be an integer >= 0: worker processes, e.g. 4, auto"),
        ("recipe", 2.5, "dataloader_num_workers=2.5 is not valid"),
    ],
)
def test_a_bad_worker_count_is_one_line_naming_it(tmp_path, where, value, said):
    recipe = write_tiny_recipe(tmp_path, **({"dataloader_num_workers": value} if where == "recipe" else {}))
    flags = ["--dataloader_num_workers", str(value)] if where == "flag" else []
    with pytest.raises(RecipeError) as error:
        parse_args(["--recipe", str(recipe), *flags])
    assert said in str(error.value) and "\n" not in str(error.value)


# ---- the shared memory the workers need ------------------------------------------------------------------------


def train_split(size: int = 32, rows: int = 3) -> datasets.Dataset:
    """A train split as the fine-tune has it: undecoded images, row positions, the seeded train transform."""
    images = [{"bytes": encoded(photo(40, 30, seed=i)), "path": f"{i}.png"} for i in range(rows)]
    split = datasets.Dataset.from_dict(
        {"image": images, "label": list(range(rows)), INDEX_COLUMN: list(range(rows))}
    ).cast_column("image", datasets.Image(decode=False))
    split.set_transform(build_transforms(size, (0.5,) * 3, (0.5,) * 3, train=True, seed=0))
    return split


def args_for(**values):
    from transformers import TrainingArguments

    defaults = {"output_dir": "unused", "per_device_train_batch_size": 32, "dataloader_num_workers": 8}
    return TrainingArguments(**{**defaults, **values})


def test_bytes_per_image_are_measured_from_what_the_transform_returns():
    example = train_split(size=32)[0]
    pixels = example["pixel_values"]
    assert example_bytes(example) == pixels.element_size() * pixels.nelement()  # labels and index: no arrays
    assert example_bytes({"pixel_values": pixels.to(torch.uint8)}) * 4 == example_bytes({"pixel_values": pixels})


@pytest.mark.parametrize(
    ("values", "processes", "factor"),
    [
        ({}, 1, 32 * 2 * 8),  # torch's prefetch of 2 batches a worker
        ({"dataloader_prefetch_factor": 4}, 1, 32 * 4 * 8),
        ({}, 2, 32 * 2 * 8 * 2),  # the processes on one machine share /dev/shm
        ({"dataloader_num_workers": 0}, 1, 0),
    ],
)
def test_the_shared_memory_need_is_batch_times_prefetch_times_workers_times_bytes(values, processes, factor):
    assert shared_memory_need(args_for(**values), 1000, processes) == factor * 1000


def test_too_little_shared_memory_is_one_line_naming_the_fixes(monkeypatch, caplog):
    split = train_split(size=32)
    per_image = example_bytes(split[0])
    need = 32 * 2 * 8 * per_image
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(hardware.shutil, "disk_usage", lambda path: DiskUsage(2**26, 2**26 - need // 3, need // 3))
    with pytest.raises(ValueError) as error:
        check_data_loading(args_for(), split)
    message = str(error.value)
    assert "\n" not in message
    assert "/dev/shm" in message and "batch 32 x prefetch 2 x 8 workers x 1 process" in message
    # 2 workers' batches fit in a third of the need of 8
    assert "--dataloader_num_workers 2" in message and "--dataloader_prefetch_factor 1" in message
    assert "--shm-size=1g" in message
    # enough: one log line with the settings and the need
    monkeypatch.setattr(hardware.shutil, "disk_usage", lambda path: DiskUsage(2**34, 0, need))
    with caplog.at_level(logging.INFO, logger="vit_ft"):
        check_data_loading(args_for(), split)
    [line] = [record.getMessage() for record in caplog.records if "Data loading" in record.getMessage()]
    assert "8 workers per process" in line and "Shared memory" in line
    # no workers: nothing crosses shared memory, nothing is checked
    monkeypatch.setattr(hardware.shutil, "disk_usage", lambda path: DiskUsage(0, 0, 0))
    check_data_loading(args_for(dataloader_num_workers=0), split)


def test_the_need_is_measured_without_touching_the_global_rng():
    split = train_split()
    split.set_transform(build_transforms(32, (0.5,) * 3, (0.5,) * 3, train=True))  # unseeded: global RNG
    state = torch.get_rng_state()
    check_data_loading(args_for(), split, free=2**40)
    assert torch.equal(torch.get_rng_state(), state)


def test_loaders_leave_the_global_rng_alone():
    """A DataLoader draws its workers' base seed at each new iterator, from the global RNG unless it has a
    generator: persistent workers (one iterator) would then leave dropout a different RNG than no workers."""
    loader = workers.with_own_generator(torch.utils.data.DataLoader(list(range(4)), batch_size=2), seed=0)
    state = torch.get_rng_state()
    for _ in range(3):
        list(loader)
    assert torch.equal(torch.get_rng_state(), state)
    plain = torch.utils.data.DataLoader(list(range(4)), batch_size=2)
    list(plain)
    assert not torch.equal(torch.get_rng_state(), state)  # what the fix is for


# ---- fine-tunes with workers -------------------------------------------------------------------------------------

# 2 epochs of 6 steps, a checkpoint every 4 (checkpoint-8: 2 steps into epoch 2); random crops, RandAugment,
# random erasing and mixup / cutmix in the workers, dropout in the main process: each must be what it is
# without workers, so no draw may depend on a worker's id or seed, or on how many iterators the loader made.
SETTINGS = {
    **RESUME_SETTINGS,  # checkpoints every 4 steps, random crops and dropout
    "num_train_epochs": 2,
    "auto_augment": "randaugment",
    "random_erasing_prob": 0.5,
    "mixup_alpha": 0.8,
    "cutmix_alpha": 1.0,
}
WORKERS = {"dataloader_num_workers": 2, "dataloader_persistent_workers": True}


@pytest.fixture(scope="module")
def without_workers(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("without_workers")
    return final_run(finetune(tmp, write_tiny_recipe(tmp, **SETTINGS)) / "out")


@pytest.fixture(scope="module")
def with_workers_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("with_workers")
    return finetune(tmp, write_tiny_recipe(tmp, **SETTINGS, **WORKERS)) / "out"


def test_two_persistent_workers_train_exactly_as_no_workers(with_workers_dir, without_workers):
    assert_same_run(final_run(with_workers_dir), without_workers)


def test_a_run_with_workers_resumes_exactly_from_the_middle_of_an_epoch(
    tmp_path, with_workers_dir, without_workers
):
    out = tmp_path / "resumed"
    out.mkdir()
    shutil.copytree(with_workers_dir / "checkpoint-8", out / "checkpoint-8")
    recipe = with_workers_dir.parent / "tiny.yaml"  # the run's own data and backbone: a resume compares them
    finetune(tmp_path, recipe, "--output_dir", str(out), "--resume")
    assert_same_run(final_run(out), without_workers)


def test_sigterm_to_the_process_group_with_workers_saves_and_resumes_exactly(tmp_path, without_workers):
    """Slurm (and `kill -- -PGID`) signals every process of the job, DataLoader workers included: the workers
    ignore it, so the main process saves its preemption checkpoint (exit 75, one line) instead of dying on
    "DataLoader worker ... is killed by signal"; --resume then ends as the uninterrupted run."""
    import os
    import signal
    import sys

    from ..conftest import REPO
    from .test_resume import signal_at_checkpoint

    recipe = write_tiny_recipe(tmp_path, **SETTINGS, **WORKERS)
    out = tmp_path / "out"
    command = [sys.executable, str(REPO / "scripts" / "finetune.py"), "--recipe", str(recipe)]
    # the whole group: the workers get it too
    returncode, stderr = signal_at_checkpoint(command, tmp_path, lambda p: os.killpg(p.pid, signal.SIGTERM))
    assert "Traceback" not in stderr and "is killed by signal" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert returncode == 75 and last.startswith("error: stopped by SIGTERM; the run is saved in"), last
    finetune(tmp_path, recipe, "--resume")
    assert_same_run(final_run(out), without_workers)
