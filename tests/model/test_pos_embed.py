import pytest
import torch
from transformers import ViTModel

from vit_ft import resample_position_embeddings

from ..conftest import randomize, tiny_hf_config


def test_same_grid_is_identity():
    table = torch.randn(1, 1 + 6 * 7, 8)
    assert resample_position_embeddings(table, (6, 7), (6, 7)) is table


@pytest.mark.parametrize("new_grid", [(8, 8), (6, 10), (3, 3)])
def test_matches_transformers_runtime_interpolation(new_grid):
    model = randomize(ViTModel(tiny_hf_config()))  # 4x4 grid
    embeddings = model.embeddings
    height, width = new_grid[0] * 4, new_grid[1] * 4
    tokens = torch.zeros(1, 1 + new_grid[0] * new_grid[1], 32)
    expected = embeddings.interpolate_pos_encoding(tokens, height, width)
    ours = resample_position_embeddings(embeddings.position_embeddings.detach(), (4, 4), new_grid)
    assert ours.shape == (1, 1 + new_grid[0] * new_grid[1], 32)
    torch.testing.assert_close(ours, expected.detach(), rtol=0, atol=1e-6)


def test_cls_entry_kept_and_dtype_restored():
    table = torch.randn(1, 17, 8).to(torch.bfloat16)
    out = resample_position_embeddings(table, (4, 4), (6, 6))
    assert out.dtype == torch.bfloat16
    assert torch.equal(out[:, 0], table[:, 0])


def test_constant_table_stays_constant():
    table = torch.full((1, 17, 3), 0.5)
    out = resample_position_embeddings(table, (4, 4), (7, 5))
    torch.testing.assert_close(out, torch.full((1, 36, 3), 0.5))


def test_wrong_grid_is_an_error():
    with pytest.raises(ValueError, match="do not match a 5x5 grid"):
        resample_position_embeddings(torch.randn(1, 17, 8), (5, 5), (6, 6))
