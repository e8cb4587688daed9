"""Knowledge distillation (DeiT): the loss against DeiT's formulas computed directly, the heads it trains, and
the fine-tune with a teacher (soft, hard, through the distillation token, on the logits, LoRA, exact resume, the
mistakes as one line each)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from vit_ft import ViTFTForImageClassification
from vit_ft.arguments.fields import ModelArguments
from vit_ft.tasks.losses import ClassificationLoss
from vit_ft.training.distillation import (
    DistillationLoss,
    Distiller,
    HeadOutputs,
    distillation_term,
    load_teacher,
)
from vit_ft.training.lora import apply_lora

from ..cli_runner import run_script
from ..conftest import randomize, tiny_ft_config, write_tiny_recipe
from .test_finetune_errors import assert_one_line_error
from .test_resume import assert_same_run, final_run, finetune

DIGITS = [str(d) for d in range(10)]


def deit_soft(student: torch.Tensor, teacher: torch.Tensor, tau: float) -> torch.Tensor:
    """DeiT's soft term written out: sum over the batch and classes of p_t (log p_t - log p_s) at tau, times
    tau^2, over the number of logits (DeiT's `/ outputs_kd.numel()`)."""
    log_p_s = student / tau - torch.logsumexp(student / tau, dim=1, keepdim=True)
    log_p_t = teacher / tau - torch.logsumexp(teacher / tau, dim=1, keepdim=True)
    return (log_p_t.exp() * (log_p_t - log_p_s)).sum() * tau * tau / student.numel()


def deit_hard(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """DeiT's hard term written out: the mean negative log-probability of the teacher's top class."""
    log_p_s = student - torch.logsumexp(student, dim=1, keepdim=True)
    return -log_p_s[torch.arange(len(student)), teacher.argmax(dim=1)].mean()


@pytest.mark.parametrize("tau", [0.5, 1.0, 3.0])
def test_terms_are_deits(tau):
    generator = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(6, 5, generator=generator) * 3, torch.randn(6, 5, generator=generator) * 3
    torch.testing.assert_close(distillation_term(student, teacher, "soft", tau), deit_soft(student, teacher, tau))
    torch.testing.assert_close(distillation_term(student, teacher, "hard", tau), deit_hard(student, teacher))
    assert distillation_term(teacher, teacher, "soft", tau).abs() < 1e-6  # no gap, no loss


def student(token: bool, lora: bool = False) -> torch.nn.Module:
    model = randomize(ViTFTForImageClassification(tiny_ft_config(num_labels=5, distillation_token=token)))
    if lora:
        model = apply_lora(model, ModelArguments(model_name_or_path="x", use_lora=True))
    return model.train()


def heads_of(model: torch.nn.Module, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The class head's and the distillation head's logits computed directly (as DeiT's model returns them)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    features = base.vit(pixels)
    cls = base.classifier(features.pooler_output)
    if not base.config.distillation_token:
        return cls, cls
    return cls, base.distillation_classifier(features.last_hidden_state[:, 1])  # (B, num_labels)


@pytest.mark.parametrize(
    ("token", "lora", "kind", "alpha"),
    [(True, False, "soft", 0.3), (True, False, "hard", 0.5), (False, False, "soft", 0.7),
     (False, False, "hard", 0.5), (True, True, "hard", 0.5)],
)  # fmt: skip
def test_loss_is_deits_over_the_right_heads(token, lora, kind, alpha):
    model = student(token, lora)
    generator = torch.Generator().manual_seed(1)
    pixels, labels = torch.randn(4, 3, 16, 16, generator=generator), torch.tensor([0, 1, 2, 4])
    teacher = torch.randn(4, 5, generator=generator) * 2
    base = ClassificationLoss(label_smoothing=0.1)
    loss = DistillationLoss(base, HeadOutputs(model), kind, alpha, tau=2.0)
    loss.teacher_logits = teacher
    value = loss(model(pixel_values=pixels), labels)
    cls, dist = heads_of(model, pixels)
    term = deit_soft(dist, teacher, 2.0) if kind == "soft" else deit_hard(dist, teacher)
    expected = (1 - alpha) * F.cross_entropy(cls, labels, label_smoothing=0.1) + alpha * term
    torch.testing.assert_close(value, expected)
    # evaluation: the model's averaged logits and the labels alone
    model.eval()
    with torch.no_grad():
        outputs = model(pixel_values=pixels)
        torch.testing.assert_close(loss(outputs, labels), base(outputs, labels))


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_labels_train_the_class_head_and_the_teacher_the_distillation_head(alpha):
    """DeiT: the class token's head never sees the teacher, the distillation token's never the labels."""
    model = student(token=True)
    loss = DistillationLoss(ClassificationLoss(), HeadOutputs(model), "hard", alpha, 1.0)
    loss.teacher_logits = torch.randn(4, 5)
    loss(model(pixel_values=torch.randn(4, 3, 16, 16)), torch.tensor([0, 1, 2, 3])).backward()
    silent = model.distillation_classifier if alpha == 0.0 else model.classifier
    heard = model.classifier if alpha == 0.0 else model.distillation_classifier
    assert silent.weight.grad.abs().max() == 0 and heard.weight.grad.abs().max() > 0


def test_teacher_runs_without_gradient_in_its_dtype():
    teacher = randomize(ViTFTForImageClassification(tiny_ft_config(num_labels=5))).to(torch.bfloat16)
    loss = DistillationLoss(ClassificationLoss(), HeadOutputs(student(False)), "soft", 0.5, 1.0)
    pixels = torch.randn(2, 3, 16, 16)
    Distiller(teacher, loss).see(pixels)
    with torch.no_grad():
        expected = teacher(pixel_values=pixels.to(torch.bfloat16)).logits.float()
    assert loss.teacher_logits.dtype == torch.float32 and not loss.teacher_logits.requires_grad
    assert torch.equal(loss.teacher_logits, expected)


def test_teachers_load_as_their_own_class_computes_them(tmp_path):
    """A transformers ViT classifier through vit_ft's loader and another transformers classifier through
    AutoModelForImageClassification: each gives its own class's logits, frozen, in eval mode."""
    from transformers import ResNetConfig, ResNetForImageClassification, ViTForImageClassification

    from ..conftest import tiny_hf_config

    labels = {"id2label": dict(enumerate(DIGITS)), "label2id": {n: i for i, n in enumerate(DIGITS)}}
    references = {
        "vit": randomize(ViTForImageClassification(tiny_hf_config(**labels)), seed=4),
        "resnet": randomize(ResNetForImageClassification(
            ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], **labels)), seed=5),
    }  # fmt: skip
    pixels = torch.randn(2, 3, 16, 16)
    for name, reference in references.items():
        reference.save_pretrained(tmp_path / name)
        teacher = load_teacher(str(tmp_path / name), DIGITS)
        assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
        assert isinstance(teacher, ViTFTForImageClassification) is (name == "vit")
        with torch.no_grad():
            torch.testing.assert_close(teacher(pixel_values=pixels).logits, reference(pixel_values=pixels).logits)
    assert next(load_teacher(str(tmp_path / "vit"), DIGITS, bf16=True).parameters()).dtype == torch.bfloat16


# ---- the fine-tune with a teacher -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def token_backbone(tmp_path_factory) -> Path:
    """A tiny vit_ft checkpoint with DeiT's distillation token (the 10 digit classes)."""
    path = tmp_path_factory.mktemp("token_backbone")
    config = tiny_ft_config(distillation_token=True, id2label=dict(enumerate(DIGITS)))
    randomize(ViTFTForImageClassification(config), seed=3).save_pretrained(path)
    return path


def count_teacher_calls(monkeypatch) -> list[tuple[torch.Tensor, torch.dtype]]:
    """Each training batch the teacher sees, with the teacher's dtype then."""
    seen: list[tuple[torch.Tensor, torch.dtype]] = []
    see = Distiller.see

    def spy(self, pixel_values):
        seen.append((pixel_values, next(self.teacher.parameters()).dtype))
        return see(self, pixel_values)

    monkeypatch.setattr(Distiller, "see", spy)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "token", "lora", "bf16"),
    [("soft", True, False, False), ("hard", False, False, False), ("hard", True, True, False),
     ("soft", False, False, True)],
)  # fmt: skip
def test_finetune_with_a_teacher(tmp_path, tiny_finetuned_dir, token_backbone, monkeypatch, capfd, kind, token,
                                 lora, bf16):  # fmt: skip
    seen = count_teacher_calls(monkeypatch)
    before = {p.name: p.read_bytes() for p in tiny_finetuned_dir.iterdir() if p.is_file()}
    extra = {"model_name_or_path": str(token_backbone)} if token else {}
    recipe = write_tiny_recipe(
        tmp_path, teacher_model_name_or_path=str(tiny_finetuned_dir), distillation_type=kind,
        distillation_alpha=0.5, distillation_tau=2.0, use_lora=lora, merge_lora=lora,
        **({"bf16": True, "use_cpu": True} if bf16 else {}), **extra,
    )  # fmt: skip
    result = run_script("scripts/finetune.py", ["--recipe", str(recipe)], capfd, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    logs = result.stdout + result.stderr
    assert f"Distilling from {tiny_finetuned_dir}: {kind}" in logs
    assert ("through the distillation token" in logs) is token
    assert len(seen) == 12  # 2 epochs of 6 training batches; never an evaluation batch
    assert all(p.dtype == torch.float32 and p.shape[1:] == (3, 32, 32) for p, _ in seen)  # the augmented pixels
    assert {dtype for _, dtype in seen} == {torch.bfloat16 if bf16 else torch.float32}  # the student's precision
    out = tmp_path / "out"
    with safe_open(out / "model.safetensors", "pt") as weights:
        saved = set(weights.keys())
    built = ViTFTForImageClassification.from_pretrained(out)
    assert saved == set(built.state_dict())  # the student alone: no teacher weight in the model
    assert built.config.distillation_token is token
    record = json.loads((out / "checkpoint-12" / "vit_ft_checkpoint.json").read_text())
    assert str(tiny_finetuned_dir) in json.dumps(record)  # the teacher is part of what a resume compares
    assert {p.name: p.read_bytes() for p in tiny_finetuned_dir.iterdir() if p.is_file()} == before


@pytest.mark.slow
def test_resume_with_a_teacher_is_exact_and_a_changed_teacher_is_refused(tmp_path, tiny_finetuned_dir, capfd):
    first = tmp_path / "first"
    first.mkdir()
    recipe = write_tiny_recipe(
        first, teacher_model_name_or_path=str(tiny_finetuned_dir), distillation_type="soft",
        hidden_dropout_prob=0.1, crop_scale_min=0.5, save_strategy="steps", save_steps=4, save_total_limit=None,
        load_best_model_at_end=False,
    )  # fmt: skip
    finetune(first, recipe, capfd=capfd)
    uninterrupted = final_run(first / "out")
    out = tmp_path / "resumed"
    out.mkdir()
    shutil.copytree(first / "out" / "checkpoint-8", out / "checkpoint-8")  # 2 steps into epoch 2
    refused = run_script(
        "scripts/finetune.py",
        ["--recipe", str(recipe), "--output_dir", str(out), "--resume", "--distillation_alpha", "0.9"],
        capfd, cwd=first,
    )  # fmt: skip
    assert_one_line_error(refused, "distillation_alpha")
    finetune(first, recipe, "--output_dir", str(out), "--resume", capfd=capfd)
    assert_same_run(final_run(out), uninterrupted)


# id -> (flags, where {tmp} is the test's folder and {teacher} the tiny fine-tuned folder; words in the error)
BAD = {
    "missing teacher": (["--teacher_model_name_or_path", "{tmp}/outputs/digits"], "no such folder; pass a fine-tuned classifier"),
    "alpha above 1": (["--teacher_model_name_or_path", "{teacher}", "--distillation_alpha", "1.5"],
                      "distillation_alpha=1.5 must be in [0, 1]"),
    "alpha below 0": (["--teacher_model_name_or_path", "{teacher}", "--distillation_alpha", "-0.1"],
                      "distillation_alpha=-0.1 must be in [0, 1]"),
    "tau 0": (["--teacher_model_name_or_path", "{teacher}", "--distillation_tau", "0"],
              "distillation_tau=0.0 must be positive"),
    "tau nan": (["--teacher_model_name_or_path", "{teacher}", "--distillation_tau", "nan"], "distillation_tau=nan"),
    "unknown type": (["--teacher_model_name_or_path", "{teacher}", "--distillation_type", "medium"],
                     "is not one of: soft, hard"),
    "settings without a teacher": (["--distillation_type", "soft"], "distillation_type needs a teacher"),
    "other classes": (["--teacher_model_name_or_path", "{classifier}"], "predicts 3 classes [ant, bee, wasp]"),
    "teacher as output": (["--teacher_model_name_or_path", "{teacher}", "--output_dir", "{teacher}"],
                          "is inside the input folder"),
    "teacher as a sweep's output": (["--teacher_model_name_or_path", "{teacher}", "--output_dir", "{teacher}/sweep",
                                     "--sweep", "learning_rate=0.001,0.002"], "is inside the input folder"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD)
def test_bad_distillation_inputs_are_one_line(case, tmp_path, tiny_finetuned_dir, hf_classifier_dir, capfd):
    flags, expected = BAD[case]
    if case.startswith("teacher as"):  # a copy: the session's teacher stays as it is
        copy = tmp_path / "teacher"
        shutil.copytree(tiny_finetuned_dir, copy)
        tiny_finetuned_dir = copy
    names = {"tmp": tmp_path, "teacher": tiny_finetuned_dir, "classifier": hf_classifier_dir}
    recipe = write_tiny_recipe(tmp_path)
    args = ["--recipe", str(recipe), *(flag.format(**names) for flag in flags)]
    before = sorted(tiny_finetuned_dir.rglob("*"))
    result = run_script("scripts/finetune.py", args, capfd, cwd=tmp_path)
    assert_one_line_error(result, expected)
    assert sorted(tiny_finetuned_dir.rglob("*")) == before  # nothing written into the teacher's folder
