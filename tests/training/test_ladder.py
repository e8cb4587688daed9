"""`method: auto`: when the ladder climbs (a table of gains and budgets), the family's parameter-efficient rung
(stub rungs: the rung taken, its arguments, the report naming it), and one ladder end to end on the real digits with
an injected clock (never wall time): the rungs' folders, the winner copied into the output folder as a model the
tools load, report.md's table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import CLIPConfig, ViTConfig

from vit_ft import ViTFTConfig
from vit_ft.arguments.method_defaults import ladder_peft_rung, method_defaults
from vit_ft.arguments.recipes import build_plan
from vit_ft.bench.suites import PUBLISHED
from vit_ft.tools.trained import load_trained
from vit_ft.training.ladder import RUNGS, Rung, next_rung_reason, run_ladder
from vit_ft.training.stages import run_finetune

from ..conftest import write_tiny_recipe


@pytest.mark.parametrize(
    ("validations", "min_gain", "spent", "budget", "stops"),
    [
        ([0.50], 1.0, 0.0, None, ""),  # kNN always leads on to the linear probe
        ([0.50, 0.60], 1.0, 0.0, None, ""),  # +10 points: on to LoRA
        ([0.50, 0.505], 1.0, 0.0, None, "gained +0.50 points"),  # half a point is not above one
        ([0.50, 0.51], 1.0, 0.0, None, "gained +1.00 points"),  # exactly the threshold: not above it
        ([0.60, 0.50, 0.62], 1.0, 0.0, None, ""),  # the gain is over the best below (0.60): +2 > 1
        ([0.60, 0.70, 0.62], 1.0, 0.0, None, "gained -8.00 points"),  # below the best rung: stop
        ([0.50, 0.60], 1.0, 600.0, 10.0, "budget of 10 minutes was spent"),
        ([0.50, 0.60], 1.0, 599.0, 10.0, ""),
        ([None], 1.0, 0.0, None, "no validation metric"),
    ],
)
def test_when_the_ladder_climbs(validations, min_gain, spent, budget, stops):
    rungs = [Rung(method, True, value) for method, value in zip(RUNGS, validations, strict=False)]
    why = next_rung_reason(rungs, min_gain, spent, budget)
    assert (stops in why) if stops else why == ""


class FakeClock:
    """Ten seconds pass at each reading."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 10.0
        return self.now


@pytest.mark.slow
def test_ladder_end_to_end_with_an_injected_clock(tmp_path):
    recipe = write_tiny_recipe(tmp_path, num_train_epochs=1, max_train_samples=60, max_eval_samples=30)
    plan = build_plan(
        ["--recipe", str(recipe), "--method", "auto", "--budget_minutes", "1", "--ladder_min_gain", "0"]
    )
    model_args, _, training_args = plan.arguments
    # readings: start 10; kNN 20-30; linear's check 40 (< 60 s: on), 50-60; LoRA's check 70 >= 60: stop
    rung = lambda rung_model, rung_training: run_finetune(plan.with_arguments(rung_model, rung_training))  # noqa: E731
    metrics = run_ladder(model_args, training_args, rung, clock=FakeClock())
    out = tmp_path / "out"
    record = json.loads((out / "ladder.json").read_text())
    ran = [rung["method"] for rung in record["rungs"] if rung["ran"]]
    # the tiny checkpoint is a transformers ViT: the ViT family's parameter-efficient rung is SSF
    assert ran == ["knn", "linear"] and [r["method"] for r in record["rungs"]] == ["knn", "linear", "ssf", "full"]
    peft = record["rungs"][2]
    assert "budget of 1 minutes was spent" in peft["why"] or "not above ladder_min_gain" in peft["why"]
    assert all(rung["seconds"] == 10.0 for rung in record["rungs"][:2])  # the injected clock's time, not wall time
    best = max(record["rungs"][:2], key=lambda r: r["validation"])
    assert record["kept"] == best["method"] and metrics["eval_accuracy"] == best["validation"]
    for method in ran:
        assert json.loads((out / "ladder" / method / "vit_ft_run.json").read_text())["method"] == method
    # the winner is the output folder's model, loadable by the tools
    trained = load_trained(str(out))
    assert trained.model.config.head_type == ("knn" if best["method"] == "knn" else "linear")
    report = (out / "report.md").read_text()
    assert "| knn | yes |" in report and "| ssf | no |" in report and f"{100 * best['validation']:.2f}" in report


def _stub_rung(seen: list, validations: dict[str, float]):
    """A rung that trains nothing: it records the rung's model arguments, writes a file into its folder (the
    winner's files are copied) and returns the given validation."""

    def rung(rung_model, rung_training):
        seen.append(rung_model)
        folder = Path(rung_training.output_dir)
        folder.mkdir(parents=True)
        (folder / "rung.txt").write_text(rung_model.method)
        value = validations[rung_model.method]
        return {"eval_accuracy": value, "test_accuracy": value}

    return rung


@pytest.mark.parametrize(
    ("family", "config", "peft_rung"),
    [
        ("vit", lambda size: ViTConfig(**size), "ssf"),  # V-PETL Bench's ranking for ViT-B/16 IN-21k
        ("clip", lambda size: CLIPConfig(vision_config=size), "lora"),  # CLIP-LoRA, the family's rank and rate
        ("unknown", lambda size: ViTFTConfig(**size), "lora"),  # vit_ft's own checkpoints: no family, LoRA
    ],
)
def test_the_ladder_takes_the_familys_peft_rung_and_names_it(tmp_path, family, config, peft_rung):
    size = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
            "image_size": 32, "patch_size": 8}  # fmt: skip
    config(size).save_pretrained(tmp_path / "checkpoint")
    plan = build_plan(["--model_name_or_path", str(tmp_path / "checkpoint"), "--dataset_name", "a/b", "--method",
                       "auto", "--ladder_min_gain", "0", "--output_dir", str(tmp_path / "out"), "--use_cpu", "true",
                       "--bf16", "false"])  # fmt: skip
    validations = {"zeroshot": 0.3, "knn": 0.5, "linear": 0.6, peft_rung: 0.8, "full": 0.7}
    seen: list = []
    metrics = run_ladder(*plan.arguments[::2], _stub_rung(seen, validations), clock=FakeClock())
    ran = [model.method for model in seen]
    assert ran[-3:] == ["linear", peft_rung, "full"] and ("zeroshot" in ran) == (family == "clip")
    peft_model = seen[ran.index(peft_rung)]
    assert peft_model.use_lora == (peft_rung == "lora")
    expected = method_defaults("lora", family if family != "unknown" else None)
    if peft_rung == "lora":  # the family's row where the run left the keys at their defaults
        assert (peft_model.lora_r, peft_model.lora_alpha, peft_model.lora_dropout) == (
            expected.rank, expected.alpha, expected.dropout)  # fmt: skip
    assert plan.model_args.lora_r == 16  # the run's own arguments untouched
    record = json.loads((tmp_path / "out" / "ladder.json").read_text())
    assert record["kept"] == peft_rung and metrics["ladder_method"] == RUNGS.index("lora")
    assert record["peft_rung"]["method"] == peft_rung
    assert record["peft_rung"]["source"] == ladder_peft_rung(None if family == "unknown" else family)[1]
    assert (tmp_path / "out" / "rung.txt").read_text() == peft_rung  # the winner's folder copied
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"Parameter-efficient rung: **{peft_rung}**" in report and f"| {peft_rung} | yes |" in report


def test_the_vit_familys_peft_rung_is_v_petl_benchs_best_method_vit_ft_has():
    """The ladder's rung for the ViT against V-PETL Bench's published rows (ViT-B/16 IN-21k): the method of the
    highest VTAB-1k and FGVC means among those vit-ft trains (its VPT rows are our vpt)."""
    ours = {"lora": "lora", "ssf": "ssf", "vpt-shallow": "vpt", "vpt-deep": "vpt"}
    for suite in ("vtab1k", "fgvc"):
        rows = {name: sum(row) / len(row) for name, row in PUBLISHED[suite].items() if name in ours}
        assert ours[max(rows, key=rows.get)] == ladder_peft_rung("vit")[0], suite
