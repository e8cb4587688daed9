"""The LitServe API of `vit-ft serve`: LitServe's inference worker loads the model once (`setup`), reads each
request's images (`decode_request`), runs the requests it batched (up to `max_batch_size` requests, waiting at
most `batch_timeout` for them) through predict's own path (`inference.iter_batches`, then
`predict.run.batch_predictions`: the task's calibrated probabilities, labels and threshold, the OOD score) in one
forward pass, and answers each request on its own (`encode_response`).

A bad request never fails the others of its batch: its refusal (`payload.Rejected`, or an image that does not
decode) travels through the batch as a value and is answered as a 4xx JSON line by `encode_response`.
"""

from __future__ import annotations

import re
from typing import Any

import litserve as ls
from fastapi.responses import JSONResponse

from ..inference import iter_batches, source_name
from ..predict.run import batch_predictions
from .payload import Rejected, image_sources

_OBJECT = re.compile(r"<_io\.BytesIO object at 0x[0-9a-f]+>")  # Pillow's name for an upload, in its errors


class ClassifierAPI(ls.LitAPI):
    """`POST /predict` for one vit_ft model: `model` and `runtime` as `runtime.load_served` takes them (loaded in
    the worker, not pickled into it), `top_k` labels per image (a multi-label model answers the labels at or
    above its thresholds)."""

    def __init__(
        self, model: str, runtime: str = "torch", top_k: int = 5, bf16: str | bool = False,
        max_pixels: int | None = None, revision: str | None = None, threads: int | None = None, **batching: Any,
    ) -> None:  # fmt: skip
        super().__init__(**batching)
        self.model_ref, self.runtime, self.top_k = model, runtime, top_k
        self.bf16, self.max_pixels, self.revision, self.threads = bf16, max_pixels, revision, threads
        self.served: Any = None

    def setup(self, device: str) -> None:
        import torch

        from .runtime import load_served

        if self.threads:  # onnxruntime and OpenVINO take torch's count too
            torch.set_num_threads(self.threads)
        device = None if self.runtime != "torch" else device
        self.served = load_served(self.model_ref, self.runtime, device, self.bf16, self.max_pixels)
        self.revision = self.revision or self.served.info["revision"]

    # no annotations on `request` and the return: LitServe reads them as the endpoint's body and response types
    def decode_request(self, request, **kwargs):  # type: ignore[no-untyped-def]
        """The parsed body (a multipart form, or the JSON value) -> its image sources, or why it is refused."""
        return image_sources(request)

    def batch(self, inputs: list[Any]) -> list[Any]:
        return list(inputs)  # requests stay apart: `predict` flattens their images into one forward pass

    def predict(self, x: Any, **kwargs: Any) -> Any:
        """One request's sources (max_batch_size 1) or a batch of them -> its answer, or a list of answers."""
        return self.predict_requests(x) if isinstance(x, list) and _is_batch(x) else self.predict_requests([x])[0]

    def predict_requests(self, requests: list[Any]) -> list[Any]:
        """Each request's predictions (`predict.output.Prediction`s) or its refusal, from one forward pass over the
        images of all the requests that were not refused."""
        sources = [s for r in requests if not isinstance(r, Rejected) for s in r]
        predictions: list[Any] = []
        if sources:
            scorer = self.served.scorer
            forward = scorer.forward if scorer is not None else None
            (batch,) = iter_batches(self.served.runnable, sources, len(sources), progress=False, forward=forward)
            predictions = batch_predictions(batch, self.served, self.top_k, scorer)
        answers, start = [], 0
        for request in requests:
            if isinstance(request, Rejected):
                answers.append(request)
                continue
            answers.append(predictions[start : start + len(request)])
            start += len(request)
        return answers

    def encode_response(self, output, **kwargs):  # type: ignore[no-untyped-def]
        """Predictions -> the answer's JSON; a refusal, or a request with an image that does not decode -> a 4xx
        JSON line (a Response, so that the other requests of its batch are answered as usual)."""
        if isinstance(output, Rejected):
            return JSONResponse(output.body(), status_code=output.status)
        failed = [p for p in output if p.error is not None]
        if failed:
            names = "; ".join(f"{source_name(p.path)}: {_OBJECT.sub('the upload', p.error)}" for p in failed)
            message = f"{len(failed)} of {len(output)} images could not be read as images ({names})"
            return JSONResponse(Rejected(422, " ".join(message.split())).body(), status_code=422)
        return {"revision": self.revision, "runtime": self.runtime, "predictions": [_answer(p) for p in output]}


def _is_batch(x: list[Any]) -> bool:
    """Whether `predict` got a batch (a list of requests) rather than one request's list of image sources."""
    return not x or isinstance(x[0], (list, Rejected))


def _answer(prediction: Any) -> dict[str, Any]:
    return {
        "name": source_name(prediction.path),
        "labels": prediction.labels,
        "scores": prediction.scores,  # calibrated probabilities, highest first
        "unsure": prediction.unlike_training,  # unlike the training images (None: no feature bank)
        "ood_score": prediction.ood_score,
    }


__all__ = ["ClassifierAPI"]
