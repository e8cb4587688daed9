"""The harness's tables without training: the suites and the published rows as the source states them, each
cell's flags read back from the run plan they build, the summary's arithmetic, the revision pins, bad input."""

from __future__ import annotations

import json
import statistics

import datasets
import numpy as np
import pytest
from PIL import Image

from vit_ft.arguments.recipes import build_plan
from vit_ft.bench import data as bench_data
from vit_ft.bench.protocols import METHOD_RATES, TASK_RATES, cell_flags, rates
from vit_ft.bench.suites import FGVC, PUBLISHED, SUITES, VTAB1K, suite
from vit_ft.bench.table import summarize
from vit_ft.commands.bench import bench, main

from .stand_in import tiny_backbone

# V-PETL Bench's README (c188fad) states each row's mean beside its per-task numbers: the transcription of the
# per-task rows must give them back
STATED_MEANS = {
    "vtab1k": {"full": 65.57, "linear": 52.94, "vpt-shallow": 64.85, "vpt-deep": 69.43, "lora": 72.25, "ssf": 73.10},
    "fgvc": {"full": 88.54, "linear": 79.32, "vpt-shallow": 84.66, "vpt-deep": 89.10, "lora": 84.78, "ssf": 90.72},
}


def test_published_rows_give_the_means_the_source_states():
    for name, rows in PUBLISHED.items():
        assert set(rows) == set(STATED_MEANS[name])
        for method, scores in rows.items():
            assert len(scores) == len(SUITES[name].tasks), (name, method)
            assert statistics.fmean(scores) == pytest.approx(STATED_MEANS[name][method], abs=0.006), (name, method)


def test_the_suites_tasks_groups_and_protocol_rates():
    groups = [task.group for task in VTAB1K]
    assert len(VTAB1K) == 19 and (groups.count("natural"), groups.count("specialized"), groups.count("structured")) == (7, 4, 8)
    assert len(FGVC) == 5 and SUITES["vtab1k"].train_size == 800 and SUITES["vtab1k"].validation_size == 200
    names = [task.name for task in (*VTAB1K, *FGVC)]
    assert len(set(names)) == len(names) and set(names) == set(TASK_RATES)
    assert all(set(own) <= set(TASK_RATES) for own in METHOD_RATES.values())
    with pytest.raises(ValueError, match="vtab1k, fgvc"):
        suite("vtab")


@pytest.fixture(scope="module")
def saved_task(tmp_path_factory):
    """A tiny backbone and a saved dataset of the harness's prepared shape (image / label, three splits)."""
    tmp = tmp_path_factory.mktemp("task")
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)) for _ in range(6)]
    split = datasets.Dataset.from_dict({"image": images, "label": [0, 1, 2] * 2},
                                       features=datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c"])}))  # fmt: skip
    datasets.DatasetDict({"train": split, "validation": split, "test": split}).save_to_disk(str(tmp / "data"))
    return tiny_backbone(tmp / "backbone"), tmp / "data"


@pytest.mark.parametrize(("suite_name", "task", "method"), [("vtab1k", "cifar100", "lora"), ("vtab1k", "dtd", "full"),
                                                            ("fgvc", "StanfordCars", "ssf"), ("vtab1k", "svhn", "vpt")])  # fmt: skip
def test_a_cells_plan_holds_the_protocol(saved_task, tmp_path, suite_name, task, method):
    backbone, data = saved_task
    chosen = SUITES[suite_name]
    (spec,) = [t for t in chosen.tasks if t.name == task]
    flags = [*cell_flags(chosen, spec, method, seed=3), "--model_name_or_path", str(backbone), "--dataset_name",
             str(data), "--output_dir", str(tmp_path / "run"), "--use_cpu", "true", "--bf16", "false"]  # fmt: skip
    model_args, data_args, training_args = build_plan(flags).arguments
    learning_rate, weight_decay = rates(method, task)
    assert (training_args.learning_rate, training_args.weight_decay) == (learning_rate, weight_decay)
    assert model_args.method == method and training_args.seed == 3 and training_args.num_train_epochs == 100
    assert training_args.load_best_model_at_end and training_args.metric_for_best_model == "accuracy"
    assert training_args.label_smoothing_factor == (0.1 if suite_name == "vtab1k" else 0.0)
    assert data_args.crop_scale_min == 1.0 and not data_args.horizontal_flip and model_args.drop_path_rate == 0.1
    assert (method != "lora") or model_args.lora_r == 8
    assert (method != "vpt") or (model_args.vpt_tokens, model_args.vpt_deep) == (100, False)  # V-PETL's VPT-shallow


def test_summary_means_spread_and_incomplete_groups():
    chosen = SUITES["vtab1k"]
    cells = [{"task": "cifar100", "method": "lora", "test_accuracy": a} for a in (0.5, 0.7, 0.6)]
    cells += [{"task": t.name, "method": "full", "test_accuracy": 0.01 * i} for i, t in enumerate(chosen.tasks)]
    summary = summarize(chosen, cells)
    lora = summary["lora"]["tasks"]["cifar100"]
    assert lora["mean"] == pytest.approx(60.0) and lora["std"] == pytest.approx(statistics.stdev([50, 70, 60]))
    assert summary["lora"]["mean"] is None and summary["lora"]["groups"]["natural"] is None
    assert summary["full"]["mean"] == pytest.approx(statistics.fmean(range(19)))
    natural = [i for i, t in enumerate(chosen.tasks) if t.group == "natural"]
    assert summary["full"]["groups"]["natural"] == pytest.approx(statistics.fmean(natural))


def test_a_pin_that_differs_from_the_lock_is_refused(tmp_path):
    spec = bench_data.with_pin(VTAB1K[0], "me/cifar@abc")
    assert (spec.hub_id, spec.revision) == ("me/cifar", "abc")
    assert bench_data.pinned(spec, tmp_path).revision == "abc"
    assert json.loads((tmp_path / bench_data.LOCK_FILE).read_text())["cifar100"] == {"hub_id": "me/cifar", "revision": "abc"}
    with pytest.raises(ValueError, match="would mix two datasets"):
        bench_data.pinned(bench_data.with_pin(VTAB1K[0], "me/cifar@def"), tmp_path)
    with pytest.raises(ValueError, match="owner/name"):
        bench_data.with_pin(VTAB1K[0], "cifar")
    with pytest.raises(ValueError, match="--dataset nabirds="):
        bench_data.pinned(FGVC[1], tmp_path)


def test_bad_input_is_one_error_line(tmp_path, capsys):
    args = ["vtab1k", "--model", str(tmp_path), "--output_dir", str(tmp_path / "out")]
    with pytest.raises(ValueError, match="not a task of vtab1k; its tasks: cifar100"):
        bench([*args, "--tasks", "cifar10"])
    with pytest.raises(ValueError, match="distinct"):
        bench([*args, "--seeds", "1,1"])
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--train_size", "0"])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err.strip().splitlines() == ["error: --train_size must be a positive number of images, got 0."]
    assert not (tmp_path / "out").exists()
