"""The fine-tune's console: one readable line per evaluation (the log history left whole), the run's last words
(the headline metric in words and counts, where everything is, the next commands), a pre-training progress bar,
and no datasets download bars for a local folder."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from vit_ft.training.callbacks import ReadableLog, ReadableProgress, log_line, use_readable_console
from vit_ft.training.outputs import run_summary
from vit_ft.training.pretrain import pretrain_digits

from .test_pretrain import image_folder  # noqa: F401 - the fixture

STATE = SimpleNamespace(epoch=2.0, num_train_epochs=30, global_step=40, max_steps=600)
ARGS = SimpleNamespace(metric_for_best_model="accuracy")


@pytest.mark.parametrize(
    "logs, args, line",
    [
        ({"eval_loss": 0.12345, "eval_accuracy": 0.97222, "eval_top5_accuracy": 1.0, "eval_runtime": 0.9,
          "eval_samples_per_second": 160.0, "epoch": 2.0},
         ARGS, "validation at epoch 2/30, step 40/600: accuracy 97.22 %, loss 0.1235; top5_accuracy 100.00 %"),
        ({"eval_loss": 0.5, "eval_mAP": 0.8, "eval_f1_micro": 0.75, "epoch": 2.0},
         SimpleNamespace(metric_for_best_model="eval_mAP"),
         "validation at epoch 2/30, step 40/600: mAP 80.00 %, loss 0.5; f1_micro 75.00 %"),
        ({"eval_loss": 0.5, "eval_accuracy": 0.5}, SimpleNamespace(metric_for_best_model=None),
         "validation at epoch 2/30, step 40/600: accuracy 50.00 %, loss 0.5"),
        ({"loss": 0.4321, "grad_norm": 1.5, "learning_rate": 0.000291, "epoch": 2.0},
         ARGS, "epoch 2/30, step 40/600: loss 0.4321, learning rate 0.000291"),
        ({"train_runtime": 12.0, "train_samples_per_second": 3.0, "train_loss": 0.4}, ARGS, None),
    ],
)  # fmt: skip
def test_one_readable_line_per_log(logs, args, line):
    assert log_line(dict(logs), STATE, args) == line


class _Trainer:
    """What `use_readable_console` touches of a Trainer: its callback handler."""

    def __init__(self, *callbacks):
        from transformers.trainer_callback import CallbackHandler

        self.callback_handler = CallbackHandler(list(callbacks), None, None, None, None)

    def remove_callback(self, callback):
        self.callback_handler.remove_callback(callback)

    def add_callback(self, callback):
        self.callback_handler.add_callback(callback)


@pytest.mark.parametrize(
    "printer, terminal, readable",
    [(ProgressCallback, True, ReadableProgress), (ProgressCallback, False, ReadableLog),
     (PrinterCallback, True, ReadableLog), (PrinterCallback, False, ReadableLog)],
)  # fmt: skip
def test_trainer_printers_are_swapped_for_readable_ones(printer, terminal, readable):
    # the bar on a terminal; plain lines in a log (Slurm, nohup, accelerate launch's pipe) or with disable_tqdm
    trainer = _Trainer(printer)
    use_readable_console(trainer, terminal)
    assert [type(c) for c in trainer.callback_handler.callbacks] == [readable]


def test_readable_log_gives_the_rate_the_time_left_and_evaluation_lines(capfd, monkeypatch):
    from vit_ft.training import callbacks

    clock = [100.0]
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: clock[0])
    log, state = ReadableLog(), SimpleNamespace(**vars(STATE), is_local_process_zero=True, is_world_process_zero=True)
    state.global_step = 0
    log.on_train_begin(ARGS, state, None)
    clock[0], state.global_step = 120.0, 40  # 40 steps in 20 s: 560 steps left, 280 s
    log.on_log(ARGS, state, None, logs={"loss": 0.5, "learning_rate": 0.001})
    for _ in range(3):
        log.on_prediction_step(ARGS, state, None, eval_dataloader=[0, 1, 2])
    log.on_evaluate(ARGS, state, None)
    out, err = capfd.readouterr()
    assert out == "epoch 2/30, step 40/600: loss 0.5, learning rate 0.001, 2 steps/s, 4 min 40 s left\n"
    assert "Evaluation: 3/3 batch in " in err and "\r" not in err and "\x1b" not in err


def test_readable_log_prints_lines_and_leaves_the_logs_alone(capsys):
    logs = {"eval_loss": 0.25, "eval_accuracy": 0.9, "eval_runtime": 1.0}
    kept = dict(logs)
    ReadableLog().on_log(ARGS, SimpleNamespace(**vars(STATE), is_local_process_zero=True), None, logs=logs)
    assert capsys.readouterr().out == "validation at epoch 2/30, step 40/600: accuracy 90.00 %, loss 0.25\n"
    assert logs == kept


def test_the_run_ends_with_the_result_in_words_where_everything_is_and_what_next(tmp_path):
    out = tmp_path / "digits"
    (out / "examples").mkdir(parents=True)
    for name in ("model.safetensors", "README.md", "vit_ft_run.json", "training_curves.png"):
        (out / name).write_text("")
    metrics = {"test_accuracy": 355 / 360, "eval_accuracy": 0.9722, "test_loss": 0.05}
    text = run_summary(out, metrics, "accuracy", {"test": 360, "validation": 144})
    lines = text.splitlines()
    assert lines[0] == "Finished: test accuracy 98.61 % (355/360); validation accuracy 97.22 % (140/144)."
    assert lines[1] == (
        f"In {out}: model.safetensors (the model), README.md (its card: results, how to load it), vit_ft_run.json "
        "(what ran), training_curves.png (loss and metrics per evaluation), examples/ (a few validation images)."
    )
    assert f"vit-ft evaluate --model {out} --output_dir reports/digits" in text
    assert f"vit-ft predict --model {out} --output preds.csv" in text
    assert f"vit-ft export --model {out} --output_dir exports/digits --quantize int8" in text
    assert f"python demo/app.py --model {out}" in text
    ml = run_summary(out, {"test_mAP": 0.81234}, "mAP", {"test": 50})
    assert ml.startswith("Finished: test mAP 0.8123.")


@pytest.mark.parametrize("progress", [True, False])
def test_pretraining_shows_a_progress_bar_with_its_eta_unless_disabled(image_folder, tmp_path, capfd, progress,  # noqa: F811
                                                                        monkeypatch):
    from vit_ft.utils import progress as progress_module

    monkeypatch.setattr(progress_module, "FIRST_LINE_AFTER", 0.0)  # this pass takes 0.1 s: its start's line at once
    pretrain_digits(tmp_path / "vit", image_folder, epochs=2, batch_size=8, progress=progress)
    err = capfd.readouterr().err  # not a terminal: plain lines with the time left, no bar's escape codes
    assert ("Pre-training: 1/4 step (25 %), " in err and " left" in err and "Pre-training: 4/4 step in " in err) is (
        progress
    )
    assert ("train_accuracy " in err) is progress and "\r" not in err


def test_a_local_folder_loads_without_download_bars(tmp_path, capfd):
    from datasets.utils import enable_progress_bars, is_progress_bar_enabled

    from vit_ft.data.digits import write_digits_imagefolder
    from vit_ft.data.image_folders import load_class_folder

    enable_progress_bars()  # as on a terminal (`utils.logs.plain_library_logs` turns them off in a log)
    write_digits_imagefolder(tmp_path / "digits", seed=0)
    capfd.readouterr()
    dataset, classes = load_class_folder(tmp_path / "digits" / "test", "--data_dir")
    err = capfd.readouterr().err
    assert len(dataset) > 0 and len(classes) == 10
    assert "Downloading data" not in err and "Generating train split" not in err
    assert is_progress_bar_enabled()  # as it was: other bars (a Hub download) still show


def test_the_fine_tune_log_has_readable_lines_not_dicts(tiny_finetuned_dir):
    log = (tiny_finetuned_dir.parent / "finetune.log").read_text()
    assert "validation at epoch 1/2, step " in log and "{'loss'" not in log and "{'eval_loss'" not in log
    assert "Finished: test accuracy " in log and f"In {tiny_finetuned_dir}: model.safetensors" in log
    history = json.loads((tiny_finetuned_dir / "trainer_state.json").read_text())["log_history"]
    assert any("loss" in entry for entry in history) and any("eval_accuracy" in entry for entry in history)
