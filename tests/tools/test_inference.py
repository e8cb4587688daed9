"""vit_ft.tools.inference: the one batched inference loop, and the bf16 setting."""

import time

import pytest
import torch

from vit_ft import ViTFTForImageClassification
from vit_ft.data.input_spec import InputSpec
from vit_ft.tools import inference, trained
from vit_ft.utils import hardware

from ..conftest import randomize, tiny_ft_config


def tiny_classifier() -> trained.Trained:
    """A random 3-label tiny model at 16x16, on the CPU, as the tools hold one."""
    model = randomize(ViTFTForImageClassification(tiny_ft_config(num_labels=3)))
    return trained.Trained(
        model,
        InputSpec((16, 16)),
        {0: "a", 1: "b", 2: "c"},
        trained.Origin("tiny"),
        torch.device("cpu"),
    )


def test_iter_batches_reports_bad_images_and_keeps_order(tmp_path):
    classifier = tiny_classifier()
    from PIL import Image

    good = tmp_path / "good.png"
    Image.new("RGB", (20, 20), "red").save(good)
    (tmp_path / "bad.png").write_text("not an image")
    sources = [str(good), str(tmp_path / "bad.png"), str(good)]
    batches = list(inference.iter_batches(classifier, sources, batch_size=2, progress=False))
    assert [b.start for b in batches] == [0, 2]
    assert batches[0].decoded == [0] and list(batches[0].errors) == [1] and batches[1].decoded == [0]
    assert batches[0].outputs.shape == (1, 3)
    torch.testing.assert_close(batches[0].outputs, batches[1].outputs)  # the same image, the same logits


def test_iter_batches_decodes_the_next_batch_while_the_model_runs(tmp_path):
    """With workers, the next batch is being decoded while `forward` runs on this one; results and order are
    those of the plain loop."""
    import threading

    from PIL import Image

    classifier = tiny_classifier()
    sources = []
    for i in range(7):
        Image.new("RGB", (20, 20), (30 * i, 0, 0)).save(tmp_path / f"{i}.png")
        sources.append(str(tmp_path / f"{i}.png"))
    started, lock = [], threading.Lock()
    decode = classifier.transform.transform_image

    def counting_decode(source):
        with lock:
            started.append(source)
        return decode(source)

    classifier.transform.transform_image = counting_decode
    seen = []

    def forward(pixels):
        # the model's turn: wait (up to 10 s, a loaded machine) for the workers to start on the next batch
        expected = min(3 * (len(seen) + 2), len(sources))
        deadline = time.monotonic() + 10
        while len(started) < expected and time.monotonic() < deadline:
            time.sleep(0.01)
        with lock:
            seen.append(len(started))
        return classifier.logits(pixels)

    batches = list(
        inference.iter_batches(classifier, sources, 3, num_workers=2, progress=False, forward=forward)
    )
    assert seen == [6, 7, 7]  # during batch 1 the workers had started batch 2 too
    plain = list(inference.iter_batches(classifier, sources, 3, progress=False))
    for a, b in zip(batches, plain, strict=True):
        assert a.start == b.start and a.decoded == b.decoded
        torch.testing.assert_close(a.outputs, b.outputs)


def test_bf16_auto_only_where_it_was_measured_faster(monkeypatch):
    """auto: bf16 on AMD CPUs with native bf16 (measured faster), float32 on Intel (measured slower)."""
    cpu = torch.device("cpu")
    native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    monkeypatch.setattr(hardware, "cpu_vendor", lambda: "GenuineIntel")
    assert inference.bf16_helps(cpu) is False and inference.use_bf16("auto", cpu) is False
    monkeypatch.setattr(hardware, "cpu_vendor", lambda: "AuthenticAMD")
    assert inference.bf16_helps(cpu) is native and inference.use_bf16("auto", cpu) is native
    assert inference.use_bf16("true", cpu) is True and inference.use_bf16("false", cpu) is False
    assert inference.use_bf16(True, cpu) is True
    with pytest.raises(ValueError, match="--bf16 yes must be one of auto, true, false"):
        inference.use_bf16("yes", cpu)


@pytest.mark.parametrize("native", [True, False], ids=["native bf16", "no native bf16"])
def test_the_bf16_setting_is_logged_in_one_line_a_warning_where_bf16_is_emulated(monkeypatch, caplog, native):
    """Every tool resolves --bf16 here (load_trained): "true" on a CPU without native bf16 runs (torch's
    emulation) with one warning naming the measured slowdown and the fix; "auto" keeps float32 there."""
    import logging

    cpu = torch.device("cpu")
    monkeypatch.setattr(hardware, "_onednn_reports_bf16", lambda: native)
    monkeypatch.setattr(hardware, "cpu_vendor", lambda: "AuthenticAMD")
    for setting, expected in (("true", True), ("auto", native), (False, False)):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="vit_ft"):
            assert inference.use_bf16(setting, cpu) is expected
        (record,) = caplog.records
        emulated = expected and not native
        assert record.levelno == (logging.WARNING if emulated else logging.INFO)
        precision = "bf16" if expected else "float32"
        assert record.getMessage().startswith(f"Compute: {precision} on cpu; kernels: ")
        assert (hardware.EMULATED_BF16_SLOWDOWN in record.getMessage()) is emulated


def test_the_recorded_temperature_divides_every_tools_logits(tmp_path):
    from PIL import Image

    Image.new("RGB", (20, 20), "red").save(tmp_path / "a.png")
    plain = tiny_classifier()
    assert plain.temperature == 1.0  # no run record, no temperature
    record = {"calibration": {"temperature": 2.5, "split": "validation"}}
    calibrated = trained.Trained(plain.model, plain.preprocessing, plain.id2label, trained.Origin("tiny", record=record),
                                 plain.device)  # fmt: skip
    assert calibrated.temperature == 2.5
    (batch,) = inference.iter_batches(calibrated, [str(tmp_path / "a.png")], progress=False)
    torch.testing.assert_close(batch.probabilities, torch.softmax(batch.outputs / 2.5, dim=-1))
    pixels = calibrated.transform.transform_image(str(tmp_path / "a.png"))[None]
    torch.testing.assert_close(calibrated.probabilities(pixels), batch.probabilities)
    for broken in ({"calibration": {"temperature": -1}}, {"calibration": "2"}, {}):
        assert trained.Trained(plain.model, plain.preprocessing, plain.id2label, trained.Origin("t", record=broken),
                               plain.device).temperature == 1.0  # fmt: skip


# source -> what the transform makes of it: images whose pixels come out NaN or infinite (a broken transform or
# preprocessor), each an error for that image naming it; the images around them are run as before
NON_FINITE = {"nan.png": float("nan"), "inf.png": float("inf"), "minus_inf.png": -float("inf")}


def test_non_finite_pixels_are_an_error_for_that_image_naming_it(tmp_path):
    from PIL import Image

    classifier = tiny_classifier()
    decode = classifier.transform.transform_image

    def poisoning_decode(source):
        pixels = decode(source)
        bad = NON_FINITE.get(source["path"].rsplit("/", 1)[-1] if isinstance(source, dict) else source.name)
        if bad is not None:
            pixels[1, 2, 3] = bad
        return pixels

    classifier.transform.transform_image = poisoning_decode
    for name in ("good.png", *NON_FINITE):
        Image.new("RGB", (20, 20), "red").save(tmp_path / name)
    sources = [tmp_path / "good.png", tmp_path / "nan.png", {"path": str(tmp_path / "inf.png"), "bytes": None},
               tmp_path / "minus_inf.png", tmp_path / "good.png"]  # fmt: skip
    batches = list(inference.iter_batches(classifier, sources, batch_size=3, progress=False))
    assert [b.decoded for b in batches] == [[0], [1]]
    errors = {b.start + i: e for b in batches for i, e in b.errors.items()}
    assert sorted(errors) == [1, 2, 3]
    for index, error in errors.items():
        name = str(sources[index]["path"] if isinstance(sources[index], dict) else sources[index])
        assert isinstance(error, ValueError) and "\n" not in str(error)
        assert str(error).startswith(f"{name}: the pixels hold NaN or infinite values"), error
    torch.testing.assert_close(batches[0].outputs, batches[1].outputs)  # the good image, as before
    assert torch.isfinite(batches[0].outputs).all()


def test_non_finite_pixels_given_to_the_tools_logits_are_refused():
    classifier = tiny_classifier()
    pixels = torch.zeros(2, 3, 16, 16)
    pixels[1, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="^pixel_values: the pixels hold NaN or infinite values"):
        classifier.logits(pixels)


def test_the_model_itself_does_no_finiteness_pass():
    """The check is the tools' boundary: the model's forward runs NaN pixels (no pass, no host sync in a step)."""
    classifier = tiny_classifier()
    with torch.no_grad():
        logits = classifier.model(torch.full((1, 3, 16, 16), float("nan"))).logits
    assert torch.isnan(logits).all()
