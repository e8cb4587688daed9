"""Tests for vit_ft.model.checks: the one image-size check (positive, a multiple of the patch, within the token
bound) in both wordings, and the local checkpoint-config reader (the model-path check is
utils.hub_ids.check_reference's: tests/utils/test_hub_ids.py)."""

import json

import pytest

from vit_ft.model.checks import (
    FINETUNE_WORDING,
    MAX_IMAGE_TOKENS_ENV_VAR,
    TOOL_WORDING,
    check_image_size,
    config_patch,
    max_image_tokens,
    read_local_config,
)


def test_read_local_config_reads_a_local_folder_and_gives_up_quietly(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit", "patch_size": 8}))
    assert config_patch(read_local_config(str(tmp_path))) == (8, 8)
    (tmp_path / "config.json").write_text("{not json")
    assert read_local_config(str(tmp_path)) is None
    assert read_local_config(str(tmp_path / "empty-folder-that-is-not-there")) is None
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert read_local_config("nobody/not-a-cached-model", cache_dir=str(tmp_path)) is None
    assert config_patch(None) is None and config_patch({"patch_size": [14, 14]}) == (14, 14)


def test_the_tools_wording():
    assert check_image_size(None, (16, 16), 4096, default=(224, 224)) == (224, 224)  # the model's own
    assert check_image_size([384], (16, 16), 4096) == (384, 384)
    with pytest.raises(
        ValueError,
        match=r"image_size=30x30 is not a multiple of the model's patch size 4x4; use e\.g\. --image_size 32\.$",
    ):
        check_image_size(30, (4, 4))
    with pytest.raises(
        ValueError, match=r"image_size=0x0 must be positive: .*--image_size 224 \(the model's own\)"
    ):
        check_image_size(0, (16, 16), default=(224, 224))
    with pytest.raises(
        ValueError, match=r"--image_size 2048x2048 makes 16384 patch tokens .*--max_tokens 16384"
    ):
        check_image_size(2048, (16, 16), 4096)
    assert check_image_size(2048, (16, 16), None) == (2048, 2048)
    with pytest.raises(ValueError, match="one int or a"):
        check_image_size((1, 2, 3), (16, 16))


def test_the_finetune_wording_and_an_unknown_patch(monkeypatch):
    name = "someone/vit"
    with pytest.raises(
        ValueError,
        match=r"image_size=100 is not a multiple of the patch size 16 of 'someone/vit'.*--image_size 96 or 112\.$",
    ):
        check_image_size(100, (16, 16), 4096, FINETUNE_WORDING, name=name)
    with pytest.raises(ValueError, match=r"--image_size 16\.$"):
        check_image_size(10, (16, 16), 4096, FINETUNE_WORDING, name=name)
    check_image_size(30, None, 4096, FINETUNE_WORDING)  # an unknown patch: the multiple is left to the loader
    with pytest.raises(
        ValueError, match=f"makes 16384 patch tokens of 16x16.*{MAX_IMAGE_TOKENS_ENV_VAR}=16384"
    ):
        check_image_size(2048, None, max_image_tokens(), FINETUNE_WORDING)  # counted at ViT's usual 16
    monkeypatch.setenv(MAX_IMAGE_TOKENS_ENV_VAR, "many")
    with pytest.raises(ValueError, match="is not a whole number"):
        max_image_tokens()
    assert TOOL_WORDING != FINETUNE_WORDING
