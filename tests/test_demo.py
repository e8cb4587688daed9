"""The Gradio demo, served on 127.0.0.1: driven through gradio_client and in a real browser (Debian's chromium)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import struct
import sys
import zlib
from concurrent.futures import wait
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import load_digits
from transformers import AutoImageProcessor

from vit_ft import ViTFTForImageClassification
from vit_ft.data.images import load_image, resize_and_center_crop

from .conftest import REPO
from .tools.test_hub import write_lora_run

pytestmark = pytest.mark.smoke  # also run on the oldest versions of the tested range (.ci/run)

CHROMIUM = Path("/usr/bin/chromium")
# flags that let Debian's chromium run headless in a container with no network
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]  # fmt: skip
MAX_PIXELS = 30_000  # small, so that an ordinary 200x200 image trips the guard


def load_app():
    """demo/app.py as a module (the demo folder is not a package)."""
    spec = importlib.util.spec_from_file_location("vit_ft_demo_app", REPO / "demo" / "app.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def digit(index: int, size: int = 64) -> Image.Image:
    """One of sklearn's 8x8 digits, upsampled, as an 8-bit grayscale image."""
    pixels = load_digits().images[index] * (255 / 16)
    return Image.fromarray(pixels.astype(np.uint8)).resize((size, size), Image.Resampling.NEAREST)


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares width x height pixels and holds none: a decompression bomb's header."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


@pytest.fixture(scope="module")
def app():
    return load_app()


@pytest.fixture(scope="module")
def model_dir(tiny_finetuned_dir, tmp_path_factory) -> Path:
    """The tiny fine-tune's folder, with the example images it wrote (examples/)."""
    folder = tmp_path_factory.mktemp("demo") / "digits-vit"
    shutil.copytree(tiny_finetuned_dir, folder, ignore=shutil.ignore_patterns("checkpoint-*"))
    return folder


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, Path]:
    """Good images in every mode the app must take, and files it must refuse."""
    folder = tmp_path_factory.mktemp("images")
    gray = digit(0)
    rgba = gray.convert("RGBA")
    rgba.putalpha(Image.fromarray(np.tile(np.linspace(0, 255, 64, dtype=np.uint8), (64, 1))))
    sixteen = Image.fromarray((np.asarray(digit(3), dtype=np.uint16) * 257).astype(np.uint16))
    files = {
        "rgb.png": gray.convert("RGB"),
        "gray.png": gray,
        "rgba.png": rgba,
        "cmyk.jpg": digit(4).convert("RGB").convert("CMYK"),
        "palette.gif": digit(5).convert("P"),
        "sixteen_bit.png": sixteen,
        "large.png": digit(6, size=200),  # 40,000 pixels: over MAX_PIXELS
    }
    for name, image in files.items():
        image.save(folder / name)
    (folder / "notes.txt").write_text("not an image")
    (folder / "text_named.png").write_text("not an image either")
    (folder / "truncated.png").write_bytes((folder / "rgb.png").read_bytes()[:300])
    (folder / "bomb.png").write_bytes(png_header_only(30_000, 30_000))  # 900 Mpx: Pillow refuses the header
    return {p.name: p for p in folder.iterdir()}


@pytest.fixture(scope="module")
def reference(model_dir):
    """The model's own prediction, through transformers' image processor, divided by the temperature the
    fine-tune fitted (vit_ft_run.json): {label: probability}, sorted."""
    model = ViTFTForImageClassification.from_pretrained(model_dir).eval()
    processor = AutoImageProcessor.from_pretrained(model_dir)
    temperature = json.loads((model_dir / "vit_ft_run.json").read_text())["calibration"]["temperature"]

    def predict(path: Path) -> dict[str, float]:
        pixels = processor(images=load_image(path), return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            probs = model(pixel_values=pixels).logits[0].div(temperature).softmax(-1)
        order = probs.argsort(descending=True).tolist()
        return {model.config.id2label[i]: probs[i].item() for i in order}

    return predict


@pytest.fixture(scope="module")
def server(app, model_dir):
    """The demo on 127.0.0.1 at a free port, served from a background thread; its URL."""
    demo = app.build_demo(model_dir, max_pixels=MAX_PIXELS, concurrency_limit=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _, url, _ = app.launch(demo, host="127.0.0.1", port=port, prevent_thread_lock=True, quiet=True)
    yield url
    demo.close()


@pytest.fixture(scope="module")
def client(server):
    from gradio_client import Client

    return Client(server, verbose=False, analytics_enabled=False)


def test_predict_endpoint_gives_the_models_top5(client, images, reference):
    from gradio_client import handle_file

    result = client.predict(handle_file(str(images["rgb.png"])), api_name="/predict")
    expected = reference(images["rgb.png"])
    assert result["label"] == next(iter(expected))
    assert [c["label"] for c in result["confidences"]] == list(expected)[:5]
    for entry in result["confidences"]:
        assert entry["confidence"] == pytest.approx(expected[entry["label"]], abs=1e-5)


def test_rollout_endpoint_gives_a_heat_map_over_the_image(client, images):
    from gradio_client import handle_file

    path = client.predict(handle_file(str(images["rgb.png"])), api_name="/rollout")
    with Image.open(path) as overlay:
        assert overlay.mode == "RGB" and overlay.size == (448, 448)  # the display size, square like the model
        array = np.asarray(overlay, dtype=np.float32)
    assert array.std() > 10  # a map, not a blank image


def test_every_image_mode_is_classified_as_the_model_does(client, images, reference):
    from gradio_client import handle_file

    for name in ("gray.png", "rgba.png", "cmyk.jpg", "palette.gif", "sixteen_bit.png"):
        result = client.predict(handle_file(str(images[name])), api_name="/predict")
        assert result["label"] == next(iter(reference(images[name]))), name


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (None, "No image yet"),
        ("notes.txt", "notes.txt is not an image file"),
        ("text_named.png", "text_named.png is not an image file"),
        ("truncated.png", "truncated.png is damaged or truncated"),
        ("large.png", "large.png is too large (200x200 = 40,000 pixels); this demo takes at most 30,000"),
        ("bomb.png", "bomb.png is too large"),
    ],
)
def test_bad_input_is_a_visible_error_not_a_crash(client, images, name, message):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match=message.replace("(", r"\(").replace(")", r"\)")):
        client.predict(handle_file(str(images[name])) if name else None, api_name="/predict")
    # and the server still answers
    assert client.predict(handle_file(str(images["rgb.png"])), api_name="/predict")["label"]


def test_concurrent_requests_are_queued_not_dropped(client, images, reference):
    from gradio_client import handle_file

    jobs = [client.submit(handle_file(str(images["rgb.png"])), api_name="/predict") for _ in range(8)]
    done, _ = wait(jobs, timeout=120)
    assert len(done) == 8
    expected = next(iter(reference(images["rgb.png"])))
    assert [job.result()["label"] for job in jobs] == [expected] * 8


def test_examples_are_the_fine_tunes_validation_images_captioned_with_their_labels(app, model_dir, tmp_path):
    import gradio as gr

    classifier = app.Classifier(model_dir)
    names = [Path(p).name for p in classifier.examples]
    assert names == sorted(names) and len(names) == len(list((model_dir / "examples").iterdir()))
    # every class the folder has an example of is offered, captioned with its label
    folder_classes = {name.removesuffix(".png").split("_", 1)[1] for name in names}
    assert set(classifier.captions) == folder_classes and set(classifier.captions) <= set(
        classifier.labels.values()
    )
    assert classifier.captions == [name.removesuffix(".png").split("_", 1)[1] for name in names]
    assert (
        app.example_caption("07_Great_Dane.jpg") == "Great_Dane" and app.example_caption("cat.png") == "cat"
    )
    with Image.open(classifier.examples[0]) as example:
        assert example.size == (8, 8)  # sklearn's digits as stored, not the model's 32x32 input tensor
    demo = app.build_demo(classifier)
    (gallery,) = [block for block in demo.blocks.values() if isinstance(block, gr.Gallery)]
    assert [item["caption"] for item in gallery.value] == classifier.captions
    assert [item["image"]["orig_name"] for item in gallery.value] == names
    bare = tmp_path / "bare"
    shutil.copytree(model_dir, bare, ignore=shutil.ignore_patterns("examples"))
    assert app.Classifier(bare).examples == []


def test_predictions_use_the_recorded_temperature_and_say_when_unsure(app, model_dir, images, reference):
    classifier = app.Classifier(model_dir)
    fitted = json.loads((model_dir / "vit_ft_run.json").read_text())["calibration"]["temperature"]
    assert classifier.temperature == pytest.approx(fitted) and fitted != 1.0  # fitted by the fine-tune
    classifier.temperature = 4.0
    calibrated = classifier.predict(str(images["rgb.png"]))
    pixels = classifier.pixel_values(load_image(images["rgb.png"]))
    with torch.no_grad():
        probs = classifier.model(pixel_values=pixels).logits[0].div(4.0).softmax(-1)
    assert calibrated == {
        classifier.labels[int(i)]: pytest.approx(float(probs[i]), abs=1e-6)
        for i in probs.argsort(descending=True)[:5]
    }
    sure = app.describe_prediction("7", 0.93, 10, 1.0)
    assert sure == "**7**: 93 % (no temperature fitted)." and "Unsure" not in sure
    unsure = app.describe_prediction("8", 0.42, 10, 1.7)
    assert "42 % (calibrated, temperature 1.70)" in unsure
    assert "**Unsure:** the top probability is below 50 %. The model only knows its 10 classes" in unsure


@pytest.mark.parametrize(("classes", "per_class"), [(2, 4), (3, 2), (20, 1)])
def test_write_examples_is_bounded_and_spread_over_the_classes(tmp_path, classes, per_class):
    import datasets

    from vit_ft.reports.examples import MAX_CLASS_EXAMPLES, MAX_EXAMPLES, write_examples

    labels = [i % classes for i in range(40)]
    images = [Image.fromarray(np.full((20, 30, 3), 5 * i, dtype=np.uint8)) for i in range(40)]
    data = datasets.Dataset.from_dict({"image": images, "label": labels})
    data = data.cast_column("image", datasets.Image(decode=False))
    data.set_transform(
        lambda batch: {"pixel_values": [0] * len(batch["label"])}
    )  # as the fine-tune leaves it
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "old.png").write_bytes(b"from an earlier run")
    written = write_examples(data, [f"class/{i}" for i in range(classes)], tmp_path)
    limit = max(MAX_EXAMPLES, min(classes, MAX_CLASS_EXAMPLES))  # one per class, up to 20 classes
    expected_rows = [row for row in range(40) if row // classes < per_class][:limit]
    assert [p.name for p in written] == [
        f"{k:02d}_class_{labels[row]}.png" for k, row in enumerate(expected_rows)
    ]
    assert sorted(p.name for p in (tmp_path / "examples").iterdir()) == [p.name for p in written]
    for path, row in zip(written, expected_rows, strict=True):
        np.testing.assert_array_equal(np.asarray(Image.open(path)), np.asarray(images[row]))
    assert [p.name for p in tmp_path.iterdir()] == ["examples"]  # nothing half-written left aside


def test_display_view_enlarges_with_nearest_neighbour_and_reduces_as_the_model(app):
    small = digit(7, size=32).convert("RGB")
    view = app.display_view(small, (448, 448), Image.Resampling.BICUBIC)
    assert view.size == (448, 448)
    np.testing.assert_array_equal(
        np.asarray(view), np.asarray(small.resize((448, 448), Image.Resampling.NEAREST))
    )
    assert len(np.unique(np.asarray(view))) == len(np.unique(np.asarray(small)))  # sharp: no blended values
    large = Image.fromarray(np.random.default_rng(0).integers(0, 255, (600, 900, 3), dtype=np.uint8))
    reduced = app.display_view(large, (448, 448), Image.Resampling.BICUBIC)
    expected = resize_and_center_crop(large, (448, 448), resample=Image.Resampling.BICUBIC)
    np.testing.assert_array_equal(np.asarray(reduced), np.asarray(expected))


def test_rollout_panel_shows_a_small_image_sharp_under_the_map(app, model_dir, images):
    classifier = app.Classifier(model_dir)
    overlay = np.asarray(classifier.rollout(str(images["rgb.png"])), dtype=np.float32).mean(-1)  # (448, 448)
    view = app.display_view(load_image(images["rgb.png"]), classifier.display_size, classifier.resample)
    gray = np.asarray(view, dtype=np.float32).mean(-1)
    assert np.corrcoef(overlay.ravel(), gray.ravel())[0, 1] > 0.5  # the digit shows through the heat map


def test_adapter_folder_is_served_merged(app, hf_classifier_dir, images, tmp_path):
    peft_model = write_lora_run(hf_classifier_dir, tmp_path / "lora")
    for folder in (tmp_path / "lora", tmp_path / "lora" / "adapter"):
        classifier = app.Classifier(folder)
        assert classifier.size == (24, 24)
        top5 = classifier.predict(str(images["rgb.png"]))
        pixels = classifier.pixel_values(load_image(images["rgb.png"]))
        with torch.no_grad():
            probs = peft_model(pixel_values=pixels).logits[0].softmax(-1)
        labels = peft_model.base_model.model.config.id2label
        assert {labels[i]: pytest.approx(p.item(), abs=1e-5) for i, p in enumerate(probs)} == top5  # 3 labels


def test_command_line_defaults_are_local_and_private(app):
    args = app.parse_args(["--model", "me/vit-dogs"])
    assert (args.host, args.port, args.share) == ("127.0.0.1", 7860, False)


@pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (.ci/run installs it)"
)
def test_browser_upload_and_example_click_classify_at_once_and_errors_stay(
    server, model_dir, images, reference, tmp_path
):
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package (dev extra)")
    external = []

    def local_only(route):  # the page must work with no internet: nothing leaves 127.0.0.1
        if route.request.url.startswith(server.rstrip("/")):
            route.continue_()
        else:
            external.append(route.request.url)
            route.abort()

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.route("**/*", local_only)
            page.goto(server)
            upload = page.locator('#image input[type="file"]')
            top = page.locator('#labels [data-testid="label-output-value"]')
            status = page.locator("#status")
            preview = page.locator("#image img")

            # the heat map explains itself: what it shows, a colour legend, no label badge over the image
            assert "the centre crop the model sees" in page.locator("#rollout-caption").inner_text()
            legend_bar = page.locator("#legend-bar")
            legend_bar.wait_for(state="visible", timeout=30_000)  # is_visible alone does not wait for the page
            assert legend_bar.is_visible()
            assert "most attention" in page.locator("#legend").inner_text()

            upload.set_input_files(images["rgb.png"])  # an upload is classified without pressing Classify
            top.wait_for(timeout=30_000)
            expected = next(iter(reference(images["rgb.png"])))
            assert top.inner_text().strip() == expected
            page.locator("#rollout img").wait_for(timeout=30_000)
            assert (
                page.locator('#rollout [data-testid="block-label"]:visible').count() == 0
            )  # no badge over the map
            page.wait_for_function(
                "document.querySelector('#status').innerText.includes(' %')", timeout=30_000
            )
            assert status.inner_text().startswith(expected + ":")

            # clicking an example classifies it: its top label appears without pressing Classify
            examples = page.locator("#examples button")
            names = sorted(p.name for p in (model_dir / "examples").iterdir())
            assert examples.count() == len(names)
            caption = names[1].removesuffix(".png").split("_", 1)[1]
            assert caption in page.locator("#examples").inner_text()  # the examples are captioned
            examples.nth(1).click()
            example_top = next(iter(reference(model_dir / "examples" / names[1])))
            page.wait_for_function(
                "label => { const t = document.querySelector('#labels [data-testid=\"label-output-value\"]');"
                " return t && t.innerText.trim() === label && document.querySelector('#status').innerText.includes(label + ':'); }",
                arg=example_top,
                timeout=30_000,
            )
            preview.wait_for(timeout=30_000)
            # the preview swaps to the example after its label shows (CI once saw the earlier 64 px upload still
            # there): wait for the 8 px example itself, then check how it is drawn
            page.wait_for_function(
                "() => { const img = document.querySelector('#image img'); return img && img.naturalWidth === 8; }",
                timeout=30_000,
            )
            shown = preview.evaluate(
                "img => [img.naturalWidth, img.getBoundingClientRect().width, getComputedStyle(img).objectFit,"
                " getComputedStyle(img).imageRendering]"
            )
            assert shown[0] == 8 and shown[1] >= 224 and shown[2:] == ["contain", "pixelated"], shown
            page.screenshot(path=tmp_path / "example.png", full_page=True)

            # a file that is not an image: the reason stays on the page, and no broken image is left
            upload.set_input_files(images["text_named.png"])
            reason = "text_named.png is not an image file"
            page.wait_for_function(
                f"document.querySelector('#status').innerText.includes({reason!r})", timeout=30_000
            )
            page.wait_for_timeout(1_000)  # longer than the toast takes to show; the status is still there
            assert reason in status.inner_text() and status.inner_text().startswith("Not classified.")
            assert preview.count() == 0
            page.screenshot(path=tmp_path / "error.png", full_page=True)
        finally:
            browser.close()
    assert external == []
