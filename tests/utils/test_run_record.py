"""vit_ft.utils.run_record: the output folder's layout and the run record, written and read in one place."""

import json
import math

import numpy as np
import pytest

from vit_ft.utils.run_record import (
    ADAPTER_DIR,
    RUN_RECORD_FILE,
    read_run_record,
    recorded_seed,
    run_folder,
    write_run_record,
)


def test_written_record_reads_back_with_paths_as_strings(tmp_path):
    path = write_run_record(tmp_path, {"seed": 7, "data": {"train_dir": tmp_path / "train"}})
    assert path == tmp_path / RUN_RECORD_FILE
    assert read_run_record(tmp_path) == {"seed": 7, "data": {"train_dir": str(tmp_path / "train")}}


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, np.float32("nan")])
def test_the_record_is_valid_json_with_numbers_that_are_not_finite_as_null(tmp_path, bad, caplog):
    write_run_record(tmp_path, {"metrics": {"eval_loss": bad, "eval_accuracy": 0.5}, "data": {"alpha": [1.0, bad]}})
    text = (tmp_path / RUN_RECORD_FILE).read_text()
    record = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in the run record"))
    assert record["metrics"] == {"eval_loss": None, "eval_accuracy": 0.5} and record["data"]["alpha"] == [1.0, None]
    assert "metrics.eval_loss" in caplog.text and "data.alpha[1]" in caplog.text  # the warning names them


def test_an_adapter_folder_reads_its_runs_record(tmp_path):
    adapter = tmp_path / ADAPTER_DIR
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    write_run_record(tmp_path, {"seed": 1})
    assert run_folder(adapter) == tmp_path
    assert read_run_record(adapter) == {"seed": 1}


def test_no_record_for_hub_ids_files_and_bare_folders(tmp_path):
    assert read_run_record("google/vit-base-patch16-224-in21k") is None
    assert read_run_record(tmp_path) is None
    (tmp_path / "x.json").write_text(json.dumps({}))
    assert run_folder(tmp_path / "x.json") is None


def test_recorded_seed_prefers_the_data_seed():
    assert recorded_seed({"seed": 7, "data_seed": 3}) == 3
    assert recorded_seed({"seed": 7, "data_seed": None}) == 7
    assert recorded_seed({}) is None and recorded_seed(None) is None


def test_a_folder_is_finished_only_when_its_record_says_so(tmp_path):
    from vit_ft.utils.run_record import is_finished, mark_unfinished

    assert not is_finished(tmp_path) and not is_finished(tmp_path / "missing")
    write_run_record(tmp_path, {"seed": 1, "finished": False})
    assert not is_finished(tmp_path)
    write_run_record(tmp_path, {"seed": 1, "finished": True})
    assert is_finished(tmp_path)
    mark_unfinished(tmp_path)
    assert not is_finished(tmp_path) and read_run_record(tmp_path)["seed"] == 1
    write_run_record(tmp_path, {"seed": 1})  # written before the field existed: after the model, so finished
    assert is_finished(tmp_path)
    (tmp_path / RUN_RECORD_FILE).write_text("{cut sh")
    assert not is_finished(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [RUN_RECORD_FILE]  # no temporary left beside it
