"""What the model's forward refuses from Python, by shape only (free, and static under torch.compile and export):
one unbatched image, an empty batch, and channels-last pixels (batch, height, width, channels), each a ValueError
that says what to pass. The `torch.channels_last` memory format of a (batch, channels, height, width) tensor is
legal and gives the same logits. transformers' ViT lets all three reach its arithmetic."""

from __future__ import annotations

import pytest
import torch

from vit_ft import ViTFTForImageClassification, ViTFTModel

from ..conftest import randomize, tiny_ft_config

# name -> (pixels, words of the error): the tiny model takes 3 x 16 x 16 images
BAD_INPUTS = {
    "one unbatched image": (torch.zeros(3, 16, 16), "pass a batch: pixel_values[None]"),
    "an empty batch": (torch.zeros(0, 3, 16, 16), "an empty batch; pass at least one image"),
    "channels last (batch, height, width, channels)": (
        torch.zeros(2, 16, 16, 3),
        "(batch, height, width, channels), the channels last; pass pixel_values.permute(0, 3, 1, 2)",
    ),
    "one channels-last image": (torch.zeros(1, 24, 16, 3), "pass pixel_values.permute(0, 3, 1, 2)"),
    "a flat vector": (torch.zeros(768), "pass a (batch, channels, height, width) batch of images"),
    "a batch of videos": (torch.zeros(1, 2, 3, 16, 16), "pass a (batch, channels, height, width) batch"),
}


@pytest.fixture(scope="module")
def classifier() -> ViTFTForImageClassification:
    return randomize(ViTFTForImageClassification(tiny_ft_config(num_labels=3))).eval()


@pytest.mark.parametrize("cls", [ViTFTForImageClassification, ViTFTModel])
@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_a_badly_shaped_batch_is_a_value_error_saying_what_to_pass(classifier, cls, name):
    model = classifier if cls is ViTFTForImageClassification else classifier.vit
    pixels, words = BAD_INPUTS[name]
    with pytest.raises(ValueError) as raised, torch.no_grad():
        model(pixels)
    message = str(raised.value)
    assert words in message and f"{tuple(pixels.shape)}" in message and "\n" not in message, message


def test_the_advice_is_right(classifier):
    """What each error says to pass gives the logits of the well-formed batch."""
    batch = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = classifier(batch).logits
        torch.testing.assert_close(classifier(batch[0][None]).logits, expected[:1])
        channels_last = batch.permute(0, 2, 3, 1)  # what a user holds: (batch, height, width, channels)
        torch.testing.assert_close(classifier(channels_last.permute(0, 3, 1, 2)).logits, expected)


def test_the_channels_last_memory_format_stays_legal(classifier):
    batch = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    strided = batch.contiguous(memory_format=torch.channels_last)
    assert strided.shape == batch.shape and not strided.is_contiguous()
    with torch.no_grad():
        torch.testing.assert_close(classifier(strided).logits, classifier(batch).logits)


def test_a_three_channel_width_is_no_channels_last_batch(classifier):
    """A (batch, 3, height, 3) batch is a valid (batch, channels, height, width) one, not channels last, and an
    image three pixels wide is refused for its size, not its layout."""
    with pytest.raises(ValueError, match="not a multiple of the patch size"), torch.no_grad():
        classifier(torch.zeros(1, 3, 16, 3))


@pytest.mark.slow
def test_the_checks_compile_into_one_graph_with_dynamic_shapes(classifier):
    """The shape checks add no graph break (fullgraph) and hold for any batch size under dynamic shapes."""
    torch._dynamo.reset()  # an earlier test in this process may have left forward's code marked as skipped
    compiled = torch.compile(classifier, fullgraph=True, backend="eager", dynamic=True)
    with torch.no_grad():
        for batch_size in (2, 3, 5):
            pixels = torch.randn(batch_size, 3, 16, 16)
            torch.testing.assert_close(compiled(pixels).logits, classifier(pixels).logits)
