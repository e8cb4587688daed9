"""vit_ft.tasks.feature_bank: the bank's nearest neighbours against scikit-learn's, the thresholds fitted on
held-out features, the sample, the save/load round trip and what a folder without a bank says."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from sklearn.neighbors import NearestNeighbors

from vit_ft.tasks.feature_bank import (
    FEATURE_BANK_FILE,
    FeatureBank,
    FrozenFeatures,
    describe_input,
    expected_input_text,
    normalized,
    read_feature_bank,
    stratified_rows,
)

CENTRES = np.random.default_rng(0).normal(size=(4, 16)) * 3  # four classes' clusters in a 16-wide feature space


def cluster_samples(n: int, seed: int, centres: np.ndarray = CENTRES) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(centres), n)
    return centres[labels] + rng.normal(size=(n, centres.shape[1])), labels


def both(features: np.ndarray) -> dict[str, np.ndarray]:
    """Both spaces' features; the input space a fixed rotation of the pooled one (a space of its own)."""
    rotation = np.linalg.qr(np.random.default_rng(9).normal(size=(16, 16)))[0]
    return {"features": features, "input": features @ rotation}


def bank_of(n: int = 200, seed: int = 1) -> FeatureBank:
    features, labels = cluster_samples(n, seed)
    spaces = both(features)
    return FeatureBank(normalized(spaces["features"]), labels.astype(np.int64), np.arange(n) * 2,
                       normalized(spaces["input"]))  # fmt: skip


def test_neighbours_and_distances_match_scikit_learns_cosine_knn():
    bank = bank_of()
    queries = np.random.default_rng(1).normal(size=(37, 16)) * 5  # not normalised: the bank normalises them
    similarities, indices = bank.neighbours(queries, k=7, chunk=10)  # chunks of 10: the chunking is covered
    reference = NearestNeighbors(n_neighbors=7, metric="cosine", algorithm="brute").fit(bank.features)
    distances, expected = reference.kneighbors(queries)
    np.testing.assert_allclose(1 - similarities, distances, atol=1e-5)
    np.testing.assert_array_equal(indices, expected)
    np.testing.assert_allclose(bank.distances(queries, k=7), distances[:, -1], atol=1e-5)
    reference.fit(bank.input)
    np.testing.assert_allclose(bank.distances(queries, "input", k=2), reference.kneighbors(queries, 2)[0][:, -1],
                               atol=1e-5)  # fmt: skip


def test_thresholds_are_the_quantiles_of_the_held_out_distances_and_flag_what_lies_beyond_either():
    bank = bank_of()
    held_out, _ = cluster_samples(100, seed=2)  # the same classes, other images
    fitted = bank.fit_ood(both(held_out), k=3, quantile=0.9)
    ratios = []
    for space, values in both(held_out).items():
        knn = NearestNeighbors(n_neighbors=3, metric="cosine").fit(bank.space(space))
        reference = knn.kneighbors(values)[0][:, -1]
        assert fitted.ood["thresholds"][space] == pytest.approx(np.quantile(reference, 0.9), abs=1e-6)
        ratios.append(reference / fitted.ood["thresholds"][space])
    flagged = np.max(ratios, axis=0) > 1
    assert fitted.ood["k"] == 3 and fitted.ood["images"] == 100 and fitted.ood["split"] == "validation"
    assert fitted.ood["flagged"] == int(flagged.sum()) and 10 <= flagged.sum() <= 20  # 10 % in each space
    far, _ = cluster_samples(20, seed=3, centres=-CENTRES)  # images of no class: opposite clusters
    scores, flags = fitted.unlike_training(both(np.vstack([held_out, far])))
    np.testing.assert_array_equal(flags, scores > 1)
    np.testing.assert_array_equal(flags[:100], flagged)
    assert flags[100:].all()
    # one space far is enough: the pooled features of a held-out image, the input of a far one
    mixed = {"features": held_out[:5], "input": both(far[:5])["input"]}
    assert fitted.unlike_training(mixed)[1].all()
    with pytest.raises(ValueError, match="no fitted threshold"):
        bank.unlike_training(both(held_out))


@pytest.mark.parametrize(("counts", "limit"), [((50, 30, 20), 10), ((90, 9, 1), 20), ((5, 5), 100)])
def test_stratified_sample_keeps_every_class_in_proportion(counts, limit):
    labels = np.repeat(np.arange(len(counts)), counts)
    rows = stratified_rows(labels, limit, seed=0)
    assert min(limit, len(labels)) - len(counts) <= len(rows) <= min(limit + len(counts), len(labels))
    assert list(rows) == sorted(set(rows.tolist()))
    kept = np.bincount(labels[rows], minlength=len(counts))
    assert (kept >= 1).all()
    if len(labels) > limit:
        np.testing.assert_allclose(kept / kept.sum(), np.asarray(counts) / sum(counts), atol=0.15)


def test_a_sample_smaller_than_the_classes_keeps_its_size():
    """A smoke run's bank on many classes (16 images of a 120-breed set): one row of each of 16 classes, not one of
    each of 120 (the dogs first try banked 120 images for 2 min 44 s where its rule said 16)."""
    labels = np.repeat(np.arange(120), 9)
    rows = stratified_rows(labels, 16, seed=0)
    assert len(rows) == 16 and len(set(labels[rows].tolist())) == 16 and list(rows) == sorted(rows)
    assert list(rows) == list(stratified_rows(labels, 16, seed=0))  # seeded
    assert len(stratified_rows(labels, 120, seed=0)) == 120  # one per class at the limit: the usual rule


def test_bank_round_trips_through_its_file(tmp_path):
    bank = bank_of().fit_ood(both(cluster_samples(50, seed=3)[0]))
    multi = FeatureBank(bank.features, (np.arange(200 * 3).reshape(200, 3) % 2).astype(np.uint8), bank.rows,
                        bank.input, bank.ood, {"size": [8, 8], "colours": "grey", "background": "dark"},
                        tuple(f"train/{i % 3}/{i}.png" for i in range(200)))  # fmt: skip
    for original in (bank, multi):
        loaded = FeatureBank.load(original.save(tmp_path / FEATURE_BANK_FILE))
        np.testing.assert_array_equal(loaded.features, original.features)
        np.testing.assert_array_equal(loaded.input, original.input)
        np.testing.assert_array_equal(loaded.labels, original.labels)
        assert loaded.labels.dtype == original.labels.dtype
        np.testing.assert_array_equal(loaded.rows, original.rows)
        assert loaded.ood == original.ood and loaded.expected_input == original.expected_input
        assert loaded.sources == original.sources
    assert [p.name for p in tmp_path.iterdir()] == [FEATURE_BANK_FILE]  # no staged file left behind


def test_a_folder_without_a_usable_bank_says_why_in_one_line(tmp_path):
    bank, why = read_feature_bank(None)
    assert bank is None and "Hub model" in why
    bank, why = read_feature_bank(tmp_path)
    assert bank is None and FEATURE_BANK_FILE in why and "fine-tune again" in why and "\n" not in why
    bank_of().save(tmp_path / FEATURE_BANK_FILE)  # never fitted: no validation split
    assert "no fitted threshold" in read_feature_bank(tmp_path)[1]
    (tmp_path / FEATURE_BANK_FILE).write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="not a readable feature bank.*delete it"):
        read_feature_bank(tmp_path)


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def test_expected_input_is_read_from_the_images():
    dark_grey = [_png(Image.new("L", (8, 10), 10)) for _ in range(3)]
    light_colour = [_png(Image.new("RGB", (40, 30), (250, 200, 240))) for _ in range(3)]
    grey = describe_input(dark_grey)
    assert grey == {"size": [8, 10], "colours": "grey", "background": "dark", "border_brightness": 10.0,
                    "images_read": 3}  # fmt: skip
    colour = describe_input([*light_colour, b"not an image"])
    assert colour["colours"] == "colour" and colour["background"] == "light" and colour["images_read"] == 3
    assert expected_input_text(grey) == "grey images of about 8x10 pixels on a dark background"
    assert "32x32 pixels" in expected_input_text({}, (32, 32))


def test_the_fine_tune_claims_the_bank_as_its_own_file():
    """A user's file of the bank's name in an output folder is refused like the fine-tune's other files."""
    from vit_ft.training.checkpoints import FINETUNE_FILES

    assert FEATURE_BANK_FILE in FINETUNE_FILES.names


def test_frozen_features_give_what_a_new_pass_over_those_rows_would():
    """Rows 5, 2, 9, 7 were passed, row 2 did not decode: a later pass over 9, 2, 5 reads rows 9 and 5 back and
    leaves 2 out, as bank_features would; a row never passed means a new pass (None)."""
    rng = np.random.default_rng(0)
    values = {"features": rng.normal(size=(3, 4)), "input": rng.normal(size=(3, 2))}  # rows 5, 9, 7
    frozen = FrozenFeatures(np.array([5, 2, 9, 7]), values, [0, 2, 3])
    features, kept = frozen.select([9, 2, 5])
    assert kept == [0, 2]
    for space in ("features", "input"):
        np.testing.assert_array_equal(features[space], values[space][[1, 0]])
    assert frozen.select([9, 1]) is None
