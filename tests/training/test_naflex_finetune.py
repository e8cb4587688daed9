"""NaFlex through the fine-tune and the tools (`max_num_patches`): a tiny run on wide images
(`benchmarks/naflex.py`'s set) saves a model whose config carries the budget; predict and evaluate then feed it
NaFlex batches (the whole wide image, not a centre crop), and a recipe that mixes batches with it is one line."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.naflex import prepare, recipe
from vit_ft.data.naflex import refuse_batch_mixes

from ..cli_runner import run_script


@pytest.mark.slow
def test_naflex_finetune_then_predict_and_evaluate(tmp_path):
    from vit_ft.data.naflex import is_naflex_batch
    from vit_ft.tools.predict.run import run_prediction
    from vit_ft.tools.trained import load_trained

    prepare(tmp_path, per_class=4, seed=0)
    values = recipe(tmp_path, "naflex", seed=0, epochs=1, per_class=4)
    path = tmp_path / "naflex.yaml"
    path.write_text("\n".join(f"{key}: {json.dumps(value)}" for key, value in values.items()) + "\n")
    result = run_script("scripts/finetune.py", ["--recipe", str(path)], None, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "naflex"
    assert json.loads((out / "config.json").read_text())["max_num_patches"] == 16
    assert "test_accuracy" in json.loads((out / "all_results.json").read_text())
    from safetensors.torch import load_file

    bank = load_file(out / "feature_bank.safetensors")  # the bank's features: of NaFlex batches, as predict's
    trained = load_trained(out)
    train_images = sorted((tmp_path / "train").rglob("*.png"))
    with torch.no_grad():
        batch = trained.transform.collate([trained.transform.transform_image(path) for path in train_images])
        pooled = torch.nn.functional.normalize(trained.model.vit(**batch).pooler_output.float(), dim=-1)
    distances = torch.cdist(bank["features"].float(), pooled).min(dim=1).values  # each row: its image's feature
    assert bank["features"].shape[0] == 12 and float(distances.max()) < 1e-4

    image = next((tmp_path / "test" / "red").iterdir())
    grid = trained.transform.transform_image(image)
    assert grid.shape == (2, 6, 8 * 8 * 3)  # 32x96 -> 16x48: the whole image, 12 of the 16 patches
    batch = trained.transform.collate([grid])
    assert is_naflex_batch(batch) and trained.logits(batch).shape == (1, 3)
    images = sorted((tmp_path / "test").rglob("*.png"))
    summary = run_prediction(out, images, tmp_path / "preds.csv", figure=None, progress=False)
    assert summary is not None and (tmp_path / "preds.csv").read_text().count("\n") == len(images) + 1
    with torch.no_grad():  # predict's logits are the model's on the padded batch of each image alone
        assert torch.isfinite(trained.logits(trained.transform.collate([grid]))).all()


def test_mixing_batches_with_naflex_is_one_line():
    with pytest.raises(ValueError, match="mixup / cutmix with max_num_patches=16") as error:
        refuse_batch_mixes(16, True)
    assert "\n" not in str(error.value)
    refuse_batch_mixes(None, True)  # square crops mix as before
    refuse_batch_mixes(16, False)
