#!/usr/bin/env python
"""Gradio demo: the top-5 labels of an image and an attention-rollout heat map over the crop the model sees.

python demo/app.py --model me/vit-dogs                          # a Hub id (vit_ft or transformers format)
python demo/app.py --model outputs/dogs                         # a fine-tune output folder
python demo/app.py --model outputs/dogs/adapter --port 7861     # a LoRA adapter folder
python demo/app.py --model outputs/dogs --host 0.0.0.0          # reachable from other machines

Runs on CPU with the model's own resolution and normalisation. An upload, or a click on an example, is
classified at once (Classify runs it again). Probabilities are divided by the temperature the fine-tune fitted
on its validation split (calibrated), and a top-1 probability under 50 % is said to be unsure. An upload unlike
the training images (the folder's feature bank: `vit_ft.tasks.feature_bank`) is said to be so, whatever its
probabilities, and the page states the input the model expects (size, colours, background). A multi-label
model shows every label at or above its decision threshold (sigmoid probabilities, no temperature) and the next
few below it. API: `gradio_client.Client(url).predict(handle_file("cat.jpg"), api_name="/predict")` returns the
label confidences; `api_name="/rollout"` returns the heat map image.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home: the demo only talks to its users

import gradio as gr  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from vit_ft.commands.model_flags import check_model  # noqa: E402
from vit_ft.data.images import (  # noqa: E402
    DEFAULT_MAX_PIXELS,
    image_extensions,
    resize_and_center_crop,
    to_normalized_tensor,
)
from vit_ft.metrics.multilabel import MULTI_LABEL  # noqa: E402
from vit_ft.tasks.feature_bank import expected_input_text, feature_taps, pre_logits  # noqa: E402
from vit_ft.tools.explain.rollout import overlay_heatmap  # noqa: E402
from vit_ft.tools.ood import OODScorer  # noqa: E402
from vit_ft.tools.trained import load_trained  # noqa: E402
from vit_ft.utils.cli import ToolArgumentParser, run_tool  # noqa: E402
from vit_ft.utils.run_record import ADAPTER_DIR, EXAMPLES_DIR  # noqa: E402

# the demo's own modules, beside this file (found through sys.path[0] when run as a script, and when loaded by path)
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from app_texts import (  # noqa: E402
    BELOW_SHOWN,
    describe_labels,
    describe_prediction,
    describe_unlike,
    example_caption,
    introduction,
    threshold_source,
)
from explain_tab import ALL_CLASSES, DISPLAY_SIDE, class_map, display_view, map_panel  # noqa: E402
from uploads import open_upload, rejected  # noqa: E402

logger = logging.getLogger("vit_ft")

TOP_K = 5
READY = "Upload an image or click an example: it is classified at once."
# what a Hub id is downloaded with; never the repository's code: the demo runs vit_ft's own
HUB_FILES = ["*.json", "*.safetensors", f"{EXAMPLES_DIR}/*", f"{ADAPTER_DIR}/*"]
# system fonts: the default theme would fetch Google Fonts, and the demo must work with no internet
THEME = gr.themes.Default(
    font=["ui-sans-serif", "system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"]
)
# the input preview fills its box (Gradio's default "scale-down" leaves a 32x32 digit a dot), enlarged with
# nearest neighbour (sharp pixels, as in the rollout panel: `display_view`)
CSS = (
    "#image img { object-fit: contain !important; width: 100%; height: 100%; image-rendering: pixelated; }"
    " #examples img { image-rendering: pixelated; }"
)


class Classifier:
    """A fine-tuned model with its own preprocessing, for one image at a time on CPU.

    The resolution is the model config's; mean, std, rescale factor and resampling come from the folder's
    image processor; the geometry is the evaluation one (resize to cover, centre crop), as in
    `vit_ft.data.transforms.build_transforms(train=False)`.
    """

    def __init__(self, model: str | Path, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> None:
        self.folder = resolve_model(model)
        # a Hub id as given; a local folder by its name only (the page needs no server paths)
        self.name = Path(model).resolve().name if Path(model).exists() else str(model)
        # a LoRA adapter merged: one set of weights is faster, and rollout sees the plain model
        trained = load_trained(self.folder, device="cpu", max_pixels=max_pixels, merge_lora=True)
        self.model = trained.model.float().eval()
        self.labels = trained.id2label
        pre = trained.preprocessing
        self.size: tuple[int, int] = pre.image_size
        self.mean, self.std, self.rescale_factor, self.resample = (
            pre.mean,
            pre.std,
            pre.rescale_factor,
            pre.resample,
        )
        self.max_pixels = max_pixels
        self.task = trained.task  # its probabilities: calibrated softmax, or a sigmoid per label
        # a multi-label model: independent sigmoid probabilities, each label kept at or above its own decision
        # threshold (the config's, tuned on validation), several labels or none; no unsure, no temperature
        self.multi_label = self.task.problem_type == MULTI_LABEL
        thresholds = self.task.threshold.tolist() if self.multi_label else []
        self.thresholds = {self.labels[i]: float(t) for i, t in enumerate(thresholds)}
        self.threshold_source = threshold_source(trained.model.config, trained.run_record)
        examples = trained.origin.examples_dir
        suffixes = image_extensions()
        self.examples = sorted(
            str(p)
            for p in (examples.iterdir() if examples is not None else [])
            if p.suffix.lower() in suffixes
        )
        self.captions = [example_caption(path) for path in self.examples]
        # the feature bank (None for a folder without one, `bank_note` saying why): marks uploads unlike the
        # training images, whatever the softmax says; and what the training images look like
        scorer = OODScorer.of(trained)
        self.bank, self.bank_note = scorer.bank, scorer.note()
        self.expected = expected_input_text(self.bank.expected_input if self.bank else {}, self.size)
        scale = DISPLAY_SIDE / max(self.size)
        self.display_size = (round(self.size[0] * scale), round(self.size[1] * scale))

    @property
    def temperature(self) -> float:
        """The task's calibration temperature: 1.0 when the fine-tune fitted none (and for multi-label)."""
        return self.task.temperature

    @temperature.setter
    def temperature(self, value: float) -> None:
        self.task = dataclasses.replace(self.task, temperature=value)

    def open(self, upload: str | dict | None) -> Image.Image:
        """The upload as 8-bit RGB, or a `gr.Error` that tells the user what is wrong with it (`uploads.open_upload`);
        JPEGs decoded at a reduced scale that still covers the display size."""
        return open_upload(upload, max(DISPLAY_SIDE, *self.size), self.max_pixels)

    def pixel_values(self, image: Image.Image) -> torch.Tensor:
        """`(1, 3, height, width)` at the model's resolution and normalisation."""
        crop = resize_and_center_crop(image, self.size, resample=self.resample)
        return to_normalized_tensor(crop, self.mean, self.std, self.rescale_factor).unsqueeze(0)

    @torch.inference_mode()
    def predict(self, upload: str | dict | None) -> dict[str, float]:
        """The top-5 labels with their probabilities, calibrated: softmax of the logits / temperature. A
        multi-label model's labels at or above their thresholds and the next below (`shown_labels`)."""
        logits = self.model(pixel_values=self.pixel_values(self.open(upload))).logits
        probabilities = self.task.probabilities(logits.float())[0]  # (num_labels,)
        if self.multi_label:
            return self.shown_labels(probabilities)
        probs = torch.from_numpy(probabilities)
        top = probs.topk(min(TOP_K, probs.numel()))
        return {self.labels[int(i)]: float(p) for p, i in zip(top.values, top.indices, strict=True)}

    def shown_labels(self, probs: np.ndarray) -> dict[str, float]:
        """{label: probability} of a multi-label answer from the `(num_labels,)` sigmoid probabilities: every
        label at or above its threshold, then the BELOW_SHOWN most probable of the others, each by probability."""
        ranked = {self.labels[int(i)]: float(probs[i]) for i in np.argsort(-probs, kind="stable")}
        above = {label: p for label, p in ranked.items() if p >= self.thresholds[label]}
        below = [label for label in ranked if label not in above][:BELOW_SHOWN]
        return {**above, **{label: ranked[label] for label in below}}

    @torch.inference_mode()
    def unlike_training(self, upload: str | dict | None) -> tuple[float, bool] | None:
        """The upload's out-of-distribution score (its distance to the k-th nearest training image over the
        threshold fitted on validation, the larger of the model's two feature spaces) and whether it is above 1;
        None without a bank."""
        if self.bank is None:
            return None
        with feature_taps(self.model) as taps:
            pre_logits(self.model, self.pixel_values(self.open(upload)))
        scores, flags = self.bank.unlike_training({space: value.numpy() for space, value in taps.items()})
        return float(scores[0]), bool(flags[0])

    def example(self, selected: gr.SelectData) -> str:
        """The path of the example clicked in the gallery."""
        return self.examples[selected.index]

    def status(self, upload: str | dict | None, labels: dict | None) -> tuple[str, Any]:
        """The line above the answer, and the image input's update: the top label and how sure the model is
        (unsure below LOW_CONFIDENCE), then a warning when the feature bank marks the upload as unlike the
        training images (`describe_unlike`); or, when there is no answer, why, kept on the page (the toast fades),
        with a file that is not a readable image taken out of the input (no broken-image outline)."""
        confidences = (labels or {}).get("confidences") or []
        if confidences:
            if self.multi_label:
                line = describe_labels(confidences, self.thresholds, self.threshold_source)
            else:
                top = confidences[0]
                line = describe_prediction(top["label"], top["confidence"], len(self.labels), self.temperature)
            ood = self.unlike_training(upload)
            if ood is not None and ood[1]:
                line = f"{line}\n\n{describe_unlike(ood[0], self.bank.ood, self.expected)}"
            return line, gr.skip()
        try:
            self.open(upload)
        except gr.Error as error:
            return f"**Not classified.** {error.message}", (gr.skip() if upload is None else None)
        return "**Not classified.** The model failed on this image; see the server's log.", gr.skip()

    def rollout(self, upload: str | dict | None) -> Image.Image:
        """The image (cropped as the model sees it) with the attention-rollout map laid over it."""
        image = self.open(upload)
        heat = class_map(self.model, self.pixel_values(image), None)  # (grid_h, grid_w)
        return overlay_heatmap(display_view(image, self.display_size, self.resample), heat)

    def explanation(self, upload: str | dict | None, target: str | None) -> Image.Image:
        """The map for the class named `target` (gradient-weighted attention rollout, Chefer et al. 2021), or the
        class-agnostic rollout for ALL_CLASSES."""
        if not target or target == ALL_CLASSES:
            return self.rollout(upload)
        index = {name: i for i, name in self.labels.items()}.get(target)
        if index is None:
            raise rejected(f"{target!r} is not a class of this model.")
        image = self.open(upload)
        heat = class_map(self.model, self.pixel_values(image), index)  # (grid_h, grid_w)
        return overlay_heatmap(display_view(image, self.display_size, self.resample), heat)


def resolve_model(model: str | Path) -> Path:
    """A local folder as is; a Hub id is downloaded (weights, configs, examples; never code) to the cache."""
    check_model(model)  # the tools' one check: a missing path or file, an uncached Hub id offline, ...
    path = Path(model)
    if path.exists():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(model), allow_patterns=HUB_FILES))


def build_demo(
    model: str | Path | Classifier,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    concurrency_limit: int = 1,
) -> gr.Blocks:
    """The app: an upload, a click on an example or Classify -> the top-5 labels, or a multi-label model's labels
    at or above threshold and the next below (`/predict`), a status line (the answer and how sure it is, or why
    there is none), then the rollout heat map (`/rollout`).

    Requests wait in Gradio's queue (unbounded) and run `concurrency_limit` at a time; both endpoints share
    that limit, as they share the model.
    """
    classifier = model if isinstance(model, Classifier) else Classifier(model, max_pixels=max_pixels)
    with gr.Blocks(title=f"vit-ft: {classifier.name}") as demo:
        gr.Markdown(introduction(classifier))
        with gr.Row():
            with gr.Column():
                image = gr.Image(
                    label="Image",
                    type="filepath",
                    sources=["upload", "clipboard"],
                    height=320,
                    elem_id="image",
                )
                button = gr.Button("Classify", variant="primary", elem_id="classify")
                examples = _examples_gallery(classifier)
            with gr.Column():
                status = gr.Markdown(READY, elem_id="status")
                labels = _labels_panel(classifier)
                heatmap, target = map_panel(classifier)
        image.clear(lambda: (None, None, READY), outputs=[labels, heatmap, status], queue=False,
                    api_visibility="private")  # fmt: skip
        outputs = (image, labels, heatmap, status, target)
        # picking a class redraws the map for it (a user's pick only: a new image resets the pick, not this)
        target.input(classifier.explanation, inputs=[image, target], outputs=heatmap, preprocess=False,
                     concurrency_id="model", api_name="explain")  # fmt: skip
        _classify_on(button.click, classifier, outputs, public=True)
        _classify_on(image.upload, classifier, outputs)
        if examples is not None:
            picked = examples.select(classifier.example, outputs=image, queue=False, api_visibility="private")
            _classify_on(picked.then, classifier, outputs)
    demo.queue(default_concurrency_limit=concurrency_limit, max_size=None)
    return demo


def _labels_panel(classifier: Classifier) -> gr.Label:
    """The answer's bars: the top-5 labels; for a multi-label model the labels `shown_labels` gives, with no
    heading (gr.Label's heading names one top label, which a multi-label answer does not have)."""
    if not classifier.multi_label:
        return gr.Label(num_top_classes=TOP_K, label="Top-5 labels", elem_id="labels")
    return gr.Label(
        num_top_classes=None,
        label=f"Labels at or above their threshold, then the next {BELOW_SHOWN} below (sigmoid probabilities)",
        show_heading=False,
        elem_id="labels",
    )


def _examples_gallery(classifier: Classifier) -> gr.Gallery | None:
    """The fine-tune's example images with their labels as captions; a click classifies one."""
    if not classifier.examples:
        return None
    gr.Markdown(
        "**Examples** (labelled with their class): click one to classify it.", elem_id="examples-caption"
    )
    return gr.Gallery(
        value=list(zip(classifier.examples, classifier.captions, strict=True)),
        show_label=False,  # a label badge would cover the first image
        columns=min(4, len(classifier.examples)),
        height="auto",
        allow_preview=False,
        object_fit="contain",
        interactive=False,
        buttons=[],
        elem_id="examples",
    )


def _classify_on(trigger: Any, classifier: Classifier, outputs: tuple, public: bool = False) -> None:
    """On `trigger`: clear the previous answer, predict, write the status line, then draw the rollout.

    preprocess=False: the functions get the upload's path unopened and check the file themselves. Only the
    Classify button's chain is the API (`/predict`, `/rollout`); the others are private.
    """
    image, labels, heatmap, status, target = outputs
    visibility: dict[str, Any] = {} if public else {"api_visibility": "private"}
    shared = {"inputs": image, "preprocess": False, "concurrency_id": "model"}
    cleared = trigger(lambda: (None, None, "Classifying…", ALL_CLASSES), outputs=[labels, heatmap, status, target],
                      queue=False, api_visibility="private")  # fmt: skip
    predicted = cleared.then(
        classifier.predict, outputs=labels, **shared, **({"api_name": "predict"} if public else visibility)
    )
    for after in (predicted.success, predicted.failure):  # `then` does not run after an error
        after(classifier.status, inputs=[image, labels], outputs=[status, image], preprocess=False, queue=False,
              api_visibility="private")  # fmt: skip
    predicted.success(
        classifier.rollout, outputs=heatmap, **shared, **({"api_name": "rollout"} if public else visibility)
    )


def launch(
    demo: gr.Blocks,
    host: str = "127.0.0.1",
    port: int | None = None,
    share: bool = False,
    max_file_size: str | int | None = "50mb",
    **kwargs: Any,
) -> tuple[Any, str, str | None]:
    """`demo.launch` with the demo's settings (offline theme, no SSR, an upload size limit); our own lines for
    where it runs, naming `--share` instead of Gradio's "set share=True in launch()"."""
    quiet, block = kwargs.pop("quiet", False), not kwargs.pop("prevent_thread_lock", False)
    result = demo.launch(server_name=host, server_port=port, share=share, max_file_size=max_file_size,
                         theme=THEME, css=CSS, ssr_mode=False, quiet=True, prevent_thread_lock=True, **kwargs)  # fmt: skip
    if not quiet:
        print(f"* Running on local URL:  {demo.local_url}")
        print(f"* Public URL: {demo.share_url}" if demo.share_url else "* For a public link, add --share.")
    if block:
        demo.block_thread()
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ToolArgumentParser(__doc__)
    parser.add_argument(
        "--model", required=True, help="a model or output folder, a LoRA adapter folder, or a Hub id"
    )
    parser.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to serve other machines")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    parser.add_argument(
        "--share", action="store_true", help="also open a public *.gradio.live link (internet)"
    )
    parser.add_argument(
        "--max_pixels",
        type=int,
        default=DEFAULT_MAX_PIXELS,
        help="largest image accepted (decompression bombs)",
    )
    parser.add_argument("--max_file_size", default="50mb", help="largest upload accepted, e.g. 20mb")
    parser.add_argument(
        "--concurrency", type=int, default=1, help="requests run at once; the others wait in line"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    demo = build_demo(args.model, max_pixels=args.max_pixels, concurrency_limit=args.concurrency)
    launch(demo, host=args.host, port=args.port, share=args.share, max_file_size=args.max_file_size)


if __name__ == "__main__":
    run_tool(main)
