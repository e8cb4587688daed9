"""What `push --help` and `export --help` name, free of torch and transformers so that they answer at once: the
formats a push shares a model in, "transformers" (its own class, no remote code), "vit_ft" (our code,
trust_remote_code) or "auto" (transformers' class wherever the model is exactly one; `hub_format.choose_format`
decides); and the deployment report's default timing (`report.measure_runtimes`)."""

from __future__ import annotations

AUTO = "auto"
FORMATS = ("vit_ft", "transformers")
FORMAT_CHOICES = (AUTO, *FORMATS)
REPORT_WARMUP = 2  # untimed calls per runtime before the deployment report times it (the first compiles)
REPORT_REPEATS = 10  # timed calls per runtime and batch size; the report gives their median

__all__ = ["AUTO", "FORMATS", "FORMAT_CHOICES", "REPORT_REPEATS", "REPORT_WARMUP"]
