"""scripts/inspect_model.py and vit_ft.tools.inspect.run: the ViT paper's Figure 7 of our model, rollout overlays."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.decomposition import PCA

from vit_ft.tools.inspect.run import (
    max_patch_distance,
    mean_attention_distance,
    patch_distances,
    patch_embedding_components,
)

from ..cli_runner import run_script


def brute_force_distance(attention, grid, patch):
    """The definition, one loop per index: `attention` (heads, 1 + P, 1 + P) -> (heads,) pixels."""
    gh, gw = grid
    heads, tokens, _ = attention.shape
    result = []
    for h in range(heads):
        per_query = []
        for q in range(1, tokens):
            qr, qc = divmod(q - 1, gw)
            weights = [float(attention[h, q, k]) for k in range(1, tokens)]
            total = 0.0
            for k in range(1, tokens):
                kr, kc = divmod(k - 1, gw)
                dist = math.hypot((qr - kr) * patch[0], (qc - kc) * patch[1])
                total += weights[k - 1] * dist
            per_query.append(total / sum(weights))
        result.append(sum(per_query) / len(per_query))
    return torch.tensor(result)


def test_mean_attention_distance_matches_the_brute_force_definition():
    torch.manual_seed(0)
    grid, patch = (2, 3), (4, 5)  # non-square on purpose
    layers = [torch.softmax(torch.randn(2, 3, 7, 7) * 2, dim=-1) for _ in range(2)]
    out = mean_attention_distance(layers, grid, patch)
    assert out.shape == (2, 2, 3)  # (batch, layers, heads)
    for b in range(2):
        for layer in range(2):
            torch.testing.assert_close(out[b, layer], brute_force_distance(layers[layer][b], grid, patch))


def test_attention_distance_extremes():
    grid, patch = (3, 4), (16, 16)
    tokens = 1 + 12
    self_only = torch.eye(tokens)[None, None]  # every token attends to itself
    assert mean_attention_distance([self_only], grid, patch).abs().max() == 0
    corner = torch.zeros(1, 1, tokens, tokens)
    corner[0, 0, 1, tokens - 1] = 1.0  # first patch attends only to the opposite corner
    corner[0, 0, 2:, 2:] = torch.eye(tokens - 2)
    corner[0, 0, 0, 0] = 1.0
    expected = max_patch_distance(grid, patch) / 12  # one of 12 query patches at the max distance
    assert mean_attention_distance([corner], grid, patch).item() == pytest.approx(expected)
    assert max_patch_distance(grid, patch) == pytest.approx(patch_distances(grid, patch).max().item())


def test_patch_filter_pca_matches_sklearn():
    weight = torch.randn(40, 3, 4, 4)
    components, explained = patch_embedding_components(weight, 28)
    assert components.shape == (28, 3, 4, 4)
    reference = PCA(n_components=28).fit(weight.reshape(40, -1).numpy())
    np.testing.assert_allclose(explained.numpy(), reference.explained_variance_ratio_, rtol=1e-4, atol=1e-6)
    flat = components.reshape(28, -1).numpy()
    np.testing.assert_allclose(
        np.abs((flat * reference.components_).sum(axis=1)), 1.0, atol=1e-3
    )  # up to sign
    assert patch_embedding_components(torch.randn(8, 3, 2, 2))[0].shape[0] == 8  # no more than the filters


@pytest.fixture(scope="module")
def inspected(tiny_finetuned_dir, tmp_path_factory):
    """`python scripts/inspect_model.py` on the tiny fine-tune: two rollout images, one unreadable file."""
    tmp = tmp_path_factory.mktemp("inspect")
    test_dir = json.loads((tiny_finetuned_dir / "vit_ft_run.json").read_text())["data"]["test_dir"]
    images = sorted(Path(test_dir).glob("*/*.png"))[:2]
    (tmp / "broken.png").write_text("no image")
    args = ["--model", tiny_finetuned_dir, "--output_dir", tmp / "figs", "--num_images", "12",
            "--images", *images, tmp / "broken.png"]  # fmt: skip
    result = run_script("scripts/inspect_model.py", args, None, cwd=tmp)  # in this process
    assert result.returncode == 0, result.stderr[-4000:]
    return tmp / "figs", json.loads((tmp / "figs" / "inspection.json").read_text())


def test_every_figure_is_written(inspected):
    figs, summary = inspected
    for name in ("patch_embedding_pca.png", "position_similarity.png", "attention_distance.png",
                 "attention_rollout.png"):  # fmt: skip
        with Image.open(figs / name) as image:
            assert image.format == "PNG" and min(image.size) > 200, name
    # the digits are grey: the filters as a grey pixel meets them (summed over the channels), 4x4 = 16 values,
    # so 16 components rather than the paper's 28
    assert summary["patch_embedding_pca"]["grey"] is True and summary["patch_embedding_pca"]["components"] == 16


def test_inspection_numbers_have_the_models_shapes(inspected):
    _, summary = inspected
    assert summary["position_similarity"] == {"grid": [8, 8], "panels": 64}  # 32x32 pixels, 4x4 patches
    distances = np.array(summary["attention_distance"]["mean_distance"])
    assert distances.shape == (2, 4)  # (layers, heads) of the tiny model
    assert summary["attention_distance"]["images"] == 12
    assert summary["attention_distance"]["max_distance"] == pytest.approx(math.hypot(28, 28))
    assert (distances > 0).all() and (distances <= summary["attention_distance"]["max_distance"]).all()
    from vit_ft.tools.inspect.run import uniform_attention_distance

    assert summary["attention_distance"]["uniform_distance"] == pytest.approx(
        uniform_attention_distance((8, 8), (4, 4))
    )
    rollout = summary["rollout"]
    assert [r["error"] is None for r in rollout] == [True, True, False]
    assert all(r["label"] in [str(i) for i in range(10)] for r in rollout[:2])


def test_uniform_attention_distance_is_the_reference_every_uniform_head_sits_on():
    from vit_ft.tools.inspect.run import uniform_attention_distance

    grid, patch = (3, 4), (5, 5)
    uniform = torch.full((1, 2, 13, 13), 1 / 13)  # every token attends to all 13 equally
    distances = mean_attention_distance([uniform], grid, patch)
    torch.testing.assert_close(distances, torch.full((1, 1, 2), uniform_attention_distance(grid, patch)))
    pairs = [math.dist((r1 * 5, c1 * 5), (r2 * 5, c2 * 5)) for r1 in range(3) for c1 in range(4)
             for r2 in range(3) for c2 in range(4)]  # fmt: skip
    assert uniform_attention_distance(grid, patch) == pytest.approx(sum(pairs) / len(pairs))


def test_rollout_figure_is_bounded_and_ends_with_the_mean_map(tmp_path, monkeypatch):
    from vit_ft.reports import figures
    from vit_ft.tools.inspect.run import MAX_ROLLOUT_PANELS, plot_rollout

    from .test_inference import tiny_classifier

    saved, close = [], figures.plt.close
    monkeypatch.setattr(figures.plt, "close", saved.append)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(14):
        paths.append(tmp_path / f"image_{i}.png")
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(paths[-1])
    try:
        path, records = plot_rollout(tiny_classifier(), paths, tmp_path / "rollout.png")
        (fig,) = saved
        titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    finally:
        for figure in saved:
            close(figure)
    assert len(records) == 14 and all(r["error"] is None for r in records)
    assert len(titles) == MAX_ROLLOUT_PANELS + 1 and titles[-1] == "mean map over 14 images"
    assert titles[0].startswith("image_0.png\n")
    assert f"{MAX_ROLLOUT_PANELS} of 14 images shown" in fig._suptitle.get_text()
    assert fig.axes[-1].get_xlabel().startswith("attention rollout, each map scaled")  # the colour scale
    with Image.open(path) as image:
        assert (
            image.size[0] <= 1000 and image.size[1] <= 1100
        )  # any number of images (37 made 920x5550 before)


def test_labels_and_folders_of_images_need_no_class_of_the_model(tiny_finetuned_dir, tmp_path):
    """inspect never uses labels: a --data_dir whose classes the model does not know is sampled, and an
    --images folder gives its image files (as predict's inputs do) instead of "does not decode"."""
    test_dir = json.loads((tiny_finetuned_dir / "vit_ft_run.json").read_text())["data"]["test_dir"]
    images = sorted(Path(test_dir).glob("*/*.png"))[:3]
    for i, image in enumerate(images):
        (tmp_path / "data" / "unknown class").mkdir(parents=True, exist_ok=True)
        (tmp_path / "data" / "unknown class" / f"{i}.png").write_bytes(image.read_bytes())
    args = ["--model", tiny_finetuned_dir, "--output_dir", tmp_path / "figs", "--num_images", "3",
            "--data_dir", tmp_path / "data", "--images", tmp_path / "data"]  # fmt: skip
    result = run_script("scripts/inspect_model.py", args, None, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "figs" / "inspection.json").read_text())
    assert len(summary["rollout"]) == 3, summary["rollout"]
    assert all(row["error"] is None for row in summary["rollout"])
    (tmp_path / "empty").mkdir()
    args = ["--model", tiny_finetuned_dir, "--output_dir", tmp_path / "figs2", "--images", tmp_path / "empty"]
    result = run_script("scripts/inspect_model.py", args, None, cwd=tmp_path)
    assert result.returncode != 0 and result.stderr.strip().splitlines()[-1].endswith("no image files there.")
    assert not (tmp_path / "figs2").exists()
