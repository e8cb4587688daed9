"""`vit-ft audit`: label issues, duplicates, leaks and outliers of a dataset from a model's frozen features
(`run`: the data, the pass and the report; `findings`: the detectors, pure numpy; `probes`: the out-of-fold
probes, the best by log-loss; `labels`: label issues bounded by the noise estimate, and the self-check)."""

from .findings import Finding
from .run import AUDIT_FILES, AuditOptions, AuditSource, run_audit

__all__ = ["AUDIT_FILES", "AuditOptions", "AuditSource", "Finding", "run_audit"]
