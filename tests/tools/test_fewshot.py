"""scripts/fewshot.py and vit_ft.tools.fewshot: the least-squares probe against sklearn's Ridge, the k-shot draws,
features against transformers' ViT, a pre-trained checkpoint against random init, and the command."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge
from transformers import ViTImageProcessorPil, ViTModel

from vit_ft import ViTFTConfig
from vit_ft.data.digits import write_digits_imagefolder
from vit_ft.data.images import VIT_MEAN, VIT_STD
from vit_ft.model.export import export_to_transformers
from vit_ft.model.modeling_vit_ft import ViTFTForImageClassification
from vit_ft.tools.fewshot import (
    L2_GRID,
    draw_fewshot,
    extract_features,
    fit_least_squares,
    load_fewshot_data,
    parse_shots,
    run_fewshot,
    select_l2,
)
from vit_ft.tools.inference import load_classifier
from vit_ft.training.pretrain import read_image_folder

from ..conftest import REPO, TINY

# ---- the least-squares probe --------------------------------------------------------------------------------


@pytest.mark.parametrize("num_points", [12, 60])  # fewer points than dimensions (the dual) and more
def test_least_squares_matches_ridge_on_plus_minus_one_targets(num_points):
    rng = np.random.default_rng(0)
    features = rng.normal(size=(num_points, 20)) * rng.uniform(0.1, 5, size=20) + rng.normal(size=20)
    labels = np.arange(num_points) % 4
    fit = fit_least_squares(features, labels, num_classes=4)
    x = fit.design(features)  # whitened with the fitted points' statistics, bias column appended
    np.testing.assert_allclose(x[:, :-1].mean(0), 0, atol=1e-9)
    np.testing.assert_allclose(x[:, :-1].std(0), 1, atol=1e-4)
    targets = np.where(np.eye(4)[labels] > 0, 1.0, -1.0)
    for l2 in (0.01, 1.0, 300.0):
        ridge = Ridge(alpha=l2, fit_intercept=False, solver="cholesky").fit(x, targets)
        np.testing.assert_allclose(fit.weights(l2), ridge.coef_.T, rtol=1e-6, atol=1e-8)
        closed = np.linalg.solve(x.T @ x + l2 * np.eye(x.shape[1]), x.T @ targets)
        np.testing.assert_allclose(fit.weights(l2), closed, rtol=1e-6, atol=1e-8)
        test = rng.normal(size=(7, 20))
        np.testing.assert_allclose(
            fit.scores(test, l2), ridge.predict(fit.design(test)), rtol=1e-6, atol=1e-8
        )


def test_least_squares_separates_separable_classes():
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(3, 8)) * 4
    labels = np.repeat(np.arange(3), 5)
    fit = fit_least_squares(centres[labels] + rng.normal(size=(15, 8)) * 0.1, labels, 3)
    held_labels = np.repeat(np.arange(3), 4)
    held = centres[held_labels] + rng.normal(size=(12, 8)) * 0.1
    assert fit.accuracy(held, held_labels, 1.0) == 1.0


@pytest.mark.parametrize("seed", range(4))
def test_select_l2_takes_the_best_held_out_accuracy_and_ties_go_to_the_strongest(seed):
    rng = np.random.default_rng(seed)  # noisy overlapping classes: the accuracy changes along the grid
    labels = np.arange(40) % 5
    fit = fit_least_squares(rng.normal(size=(40, 30)) + 0.3 * np.eye(30)[labels], labels, 5)
    held_labels = np.arange(50) % 5
    held = rng.normal(size=(50, 30)) + 0.3 * np.eye(30)[held_labels]
    accuracies = {l2: fit.accuracy(held, held_labels, l2) for l2 in L2_GRID}
    best = max(accuracies.values())
    l2, accuracy = select_l2(fit, held, held_labels, L2_GRID)
    assert accuracy == best and l2 == max(v for v, a in accuracies.items() if a == best)
    assert len(set(accuracies.values())) > 1  # the grid matters here
    assert select_l2(fit, held, held_labels, (4.0,)) == (4.0, accuracies[4.0])


# ---- the k-shot draws ---------------------------------------------------------------------------------------


def test_draws_take_k_per_class_disjoint_from_the_holdout_nested_and_seeded():
    labels = np.repeat(np.arange(4), [30, 12, 20, 40])
    draw = draw_fewshot(labels, 4, (1, 3, 5), seed=7, holdout_fraction=0.25, max_holdout_per_class=6)
    assert np.bincount(labels[draw.holdout]).tolist() == [6, 3, 5, 6]  # 25 %, at most 6
    for k, rows in draw.shots.items():
        assert np.bincount(labels[rows], minlength=4).tolist() == [k] * 4
        assert len(set(rows.tolist())) == len(rows) and not set(rows.tolist()) & set(draw.holdout.tolist())
    assert set(draw.shots[1].tolist()) < set(draw.shots[3].tolist()) < set(draw.shots[5].tolist())
    again = draw_fewshot(labels, 4, (1, 3, 5), seed=7, holdout_fraction=0.25, max_holdout_per_class=6)
    assert all(np.array_equal(again.shots[k], draw.shots[k]) for k in (1, 3, 5))
    assert np.array_equal(again.holdout, draw.holdout)
    other = draw_fewshot(labels, 4, (1, 3, 5), seed=8, holdout_fraction=0.25, max_holdout_per_class=6)
    assert not np.array_equal(other.shots[5], draw.shots[5])


def test_excluded_rows_are_never_drawn_and_leave_the_other_picks_alone():
    labels = np.repeat(np.arange(3), 20)
    draw = draw_fewshot(labels, 3, (2,), seed=0)
    bad = int(draw.shots[2][0])  # a class-0 shot that turns out not to decode
    redrawn = draw_fewshot(labels, 3, (2,), seed=0, excluded=[bad])
    assert bad not in redrawn.shots[2] and bad not in redrawn.holdout
    assert np.array_equal(redrawn.shots[2][2:], draw.shots[2][2:])  # classes 1 and 2 unchanged
    assert redrawn.shots[2][0] == draw.shots[2][1]  # the class moves on along the same permutation


def test_a_class_too_small_for_the_largest_k_names_it_and_the_fix():
    labels = np.repeat(np.arange(3), [20, 7, 20])
    with pytest.raises(ValueError, match=r"--shots 10 .* class 'b' has 6 once 1 are held out.*up to 6"):
        draw_fewshot(labels, 3, (1, 10), seed=0, names=["a", "b", "c"])


def test_parse_shots():
    assert parse_shots("25, 1,5,10,5") == (1, 5, 10, 25)
    assert parse_shots([3, 1]) == (1, 3)
    for bad in ("", "0", "1,x", "-1", "1.5"):
        with pytest.raises(ValueError, match="positive numbers of images per class"):
            parse_shots(bad)


# ---- features --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    return write_digits_imagefolder(tmp_path_factory.mktemp("fewshot") / "digits")


@pytest.fixture(scope="module")
def small_digits(digits, tmp_path_factory) -> Path:
    """Three digit classes, 12 training and 4 test images each."""
    root = tmp_path_factory.mktemp("small") / "digits"
    for split, count in (("train", 12), ("test", 4)):
        for digit in ("0", "1", "2"):
            (root / split / digit).mkdir(parents=True)
            for path in sorted((digits / split / digit).iterdir())[:count]:
                shutil.copy(path, root / split / digit / path.name)
    return root


def test_features_are_transformers_vit_pooled_cls_and_bf16_stays_close(hf_backbone_dir, small_digits):
    with pytest.raises(ValueError, match="has no classification head"):  # what predict and evaluate need
        load_classifier(hf_backbone_dir, device="cpu")
    classifier = load_classifier(hf_backbone_dir, device="cpu", require_head=False)
    assert classifier.id2label == {}
    images = sorted(str(p) for p in (small_digits / "test").glob("*/*.png"))
    features, errors = extract_features(classifier, images, batch_size=5, progress=False)
    assert errors == {} and features.shape == (12, TINY["hidden_size"]) and features.dtype == np.float32
    reference = ViTModel.from_pretrained(hf_backbone_dir, add_pooling_layer=False).eval()
    pixels = torch.stack([classifier.transform.transform_image(path) for path in images])
    with torch.no_grad():
        cls = reference(pixel_values=pixels).last_hidden_state[:, 0]  # after the final LayerNorm
    np.testing.assert_allclose(features, cls.numpy(), rtol=1e-4, atol=1e-5)
    bf16, _ = extract_features(classifier, images, batch_size=5, bf16=True, progress=False)
    assert not np.array_equal(bf16, features)  # autocast ran
    np.testing.assert_allclose(bf16, features, rtol=0.05, atol=0.05 * np.abs(features).max())


def test_load_fewshot_data_reads_train_and_test_and_refuses_a_missing_split(small_digits, tmp_path):
    data = load_fewshot_data(small_digits)
    assert data.names == ["0", "1", "2"]
    assert (
        np.bincount(data.train_labels).tolist() == [12] * 3
        and np.bincount(data.test_labels).tolist() == [4] * 3
    )
    shutil.copytree(small_digits / "train", tmp_path / "only_train" / "train")
    with pytest.raises(FileNotFoundError, match="has no test/ folder"):
        load_fewshot_data(tmp_path / "only_train")


def test_load_fewshot_data_reads_a_saved_dataset_by_split_and_column(small_digits, tmp_path):
    import datasets

    def split(name: str) -> dict:
        paths = sorted((small_digits / name).glob("*/*.png"))
        return {"img": [str(p) for p in paths], "label": [int(p.parent.name) for p in paths]}

    features = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(names=["0", "1", "2"])}
    )
    saved = datasets.DatasetDict(
        {name: datasets.Dataset.from_dict(split(name), features=features) for name in ("train", "test")}
    )
    saved.save_to_disk(tmp_path / "saved")
    data = load_fewshot_data(tmp_path / "saved", image_column="img")
    assert data.names == ["0", "1", "2"] and len(data.train_labels) == 36 and len(data.test_labels) == 12
    assert np.array_equal(np.bincount(data.test_labels), [4, 4, 4])
    with pytest.raises(
        KeyError, match="test_split='val' is not a split .* available splits: \\['test', 'train'\\]"
    ):
        load_fewshot_data(tmp_path / "saved", test_split="val", image_column="img")


# ---- a pre-trained checkpoint against random init -----------------------------------------------------------


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from a second thread, and on a loaded machine its synchronisation costs tens of
    times the work: run them on one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pretrained_tiny(digits, tmp_path_factory) -> Path:
    """A tiny ViT (TINY size) pre-trained for 200 steps on 400 digits training images at 16x16, saved as a
    transformers ViTModel checkpoint without a head, like the digits recipe's: a few seconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as `one_thread`
    pixels, labels, classes = read_image_folder(digits / "train", TINY["image_size"])
    generator = torch.Generator().manual_seed(0)
    chosen = torch.randperm(len(pixels), generator=generator)[:400]
    pixels, labels = pixels[chosen], labels[chosen]
    torch.manual_seed(0)
    model = ViTFTForImageClassification(ViTFTConfig(**TINY, num_labels=len(classes))).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(200):
        batch = torch.randint(0, len(pixels), (64,), generator=generator)
        loss = model(pixels[batch], labels=labels[batch]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.set_num_threads(threads)
    size = {"height": TINY["image_size"], "width": TINY["image_size"]}
    processor = ViTImageProcessorPil(size=size, image_mean=list(VIT_MEAN), image_std=list(VIT_STD))
    folder = tmp_path_factory.mktemp("pretrained") / "vit"
    return export_to_transformers(model.eval(), folder, image_processor=processor, with_head=False)


def test_pretrained_checkpoint_scores_clearly_above_random_init_of_the_same_size(
    pretrained_tiny, digits, tmp_path, one_thread
):
    def mean_accuracy(random_init: bool) -> dict[int, float]:
        record = run_fewshot(
            pretrained_tiny, digits, tmp_path / str(random_init), shots=(1, 5), seeds=2,
            random_init=random_init, bf16="false", progress=False,
        )  # fmt: skip
        assert record["feature_dim"] == TINY["hidden_size"] and record["num_test_images"] == 360
        return {r["shots"]: r["mean_accuracy"] for r in record["results"]}

    pretrained, random = mean_accuracy(False), mean_accuracy(True)
    for k in (1, 5):
        assert pretrained[k] > random[k] + 0.1, (k, pretrained, random)
    assert (
        random[1] > 0.12
    )  # random features still carry some signal: the comparison is not with a broken run


# ---- the command ------------------------------------------------------------------------------------------


def run_script(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "fewshot.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},  # a tiny model: see `one_thread`
    )


def test_command_prints_the_table_writes_the_files_and_refuses_a_wrong_shots_value(
    hf_backbone_dir, small_digits, tmp_path
):
    broken = small_digits.parent / "with_broken"
    shutil.copytree(small_digits, broken)
    (broken / "test" / "1" / "broken.png").write_bytes(b"not a png")  # skipped with its reason
    out = tmp_path / "report"
    common = ["--model", hf_backbone_dir, "--dataset", str(broken), "--output_dir", str(out)]
    result = run_script(*common, "--shots", "1,2", "--seeds", "2", "--bf16", "false", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| shots per class | accuracy (mean ± std over seeds) |" in result.stdout
    record = json.loads((out / "fewshot.json").read_text())
    assert [r["shots"] for r in record["results"]] == [1, 2]
    assert all(len(r["accuracies"]) == 2 and len(r["l2"]) == 2 for r in record["results"])
    assert all(0 <= a <= 1 for r in record["results"] for a in r["accuracies"])
    assert all(v in L2_GRID for r in record["results"] for v in r["l2"])
    assert [s["source"].endswith("broken.png") for s in record["skipped"]] == [True]
    assert "| 1 |" in (out / "fewshot.md").read_text()
    assert (out / "fewshot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in out.iterdir()) == ["fewshot.json", "fewshot.md", "fewshot.png"]

    before = {p.name: p.read_bytes() for p in out.iterdir()}
    wrong = run_script(*common, "--shots", "0,1", cwd=tmp_path)
    assert wrong.returncode == 1 and wrong.stderr.count("\n") == 1, wrong.stderr[-3000:]
    assert wrong.stderr.startswith("error: --shots 0,1 must be a comma list of positive numbers"), (
        wrong.stderr
    )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # in process (a second start-up costs more than the rest): class "0" has 12 images, 2 held out, 10 left
    with pytest.raises(ValueError, match=r"--shots 11 needs 11 .* class '0' has 10 .* up to 10"):
        run_fewshot(hf_backbone_dir, broken, out, shots="1,11", seeds=1, progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
