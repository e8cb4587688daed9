"""Fixtures shared by the model tests: the family checkpoints saved by transformers (test_families.py)."""

from .test_families import checkpoints  # noqa: F401 - a fixture, for test_timm_families.py too
