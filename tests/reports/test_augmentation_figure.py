"""vit_ft.reports.augmentation_figure: the figure's structure (panels, titles), not its pixels."""

import pytest

from vit_ft.data.augmentation import AugmentationSpec
from vit_ft.data.mixup import MixupCutmix
from vit_ft.data.transforms import build_transforms
from vit_ft.reports.augmentation_figure import write_augmentation_figure

from ..sample_images import photo


def test_figure_shows_each_image_with_its_draws_and_a_mixed_row(tmp_path, saved_figures):
    spec = AugmentationSpec("randaugment", random_erasing_prob=0.25, random_erasing_mode="pixel")
    transform = build_transforms(24, [0.5] * 3, [0.5] * 3, train=True, seed=0, augmentation=spec)
    images = [photo(40, 30, seed=i) for i in range(2)]
    path = write_augmentation_figure(images, transform, tmp_path / "augmentations.png", draws=2,
                                     mixer=MixupCutmix(5, 0.8, 1.0, label_smoothing=0.1))  # fmt: skip
    assert path.is_file() and path.read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in tmp_path.iterdir()] == ["augmentations.png"]  # no temporary left
    (fig,) = saved_figures
    axes = fig.axes
    assert len(axes) == 3 * 3  # 2 images + the mixed row, each: original + 2 draws
    titles = [ax.get_title() for ax in axes]
    assert titles[:3] == ["original", "draw 1", "draw 2"] and titles.count("original") == 2
    assert all(t.startswith("mixed: ") for t in titles[6:8]) and titles[8] == ""
    assert sum(len(ax.images) for ax in axes) == 2 * 3 + 2
    suptitle = fig._suptitle.get_text()
    assert "RandAugment (n=2, m=9)" in suptitle and "random erasing (p=0.25, pixel)" in suptitle
    assert "mixup α=0.8 / CutMix α=1" in suptitle and "random resized crop" in suptitle


def test_figure_without_mixer_and_bad_arguments(tmp_path, saved_figures):
    transform = build_transforms(16, [0.5] * 3, [0.5] * 3, train=True, seed=0)
    write_augmentation_figure([photo(20, 20)], transform, tmp_path / "a.png", draws=2)
    assert len(saved_figures[0].axes) == 3 and "then per batch" not in saved_figures[0]._suptitle.get_text()
    with pytest.raises(ValueError, match="draws"):
        write_augmentation_figure([photo(20, 20)], transform, tmp_path / "b.png", draws=0)
    assert not (tmp_path / "b.png").exists()
