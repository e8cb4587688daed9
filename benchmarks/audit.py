"""`vit-ft audit` on digits with faults injected by a seeded script (issue 37): 5 % of the training labels flipped,
20 test images copied into train at another size and JPEG quality, 10 images of no digit (noise) added to train.
The backbone never saw the audited labels' truth: it is the digits pre-training (`training.pretrain`) run on the
faulted training folder. Recall and precision per kind; for label issues the audit's flags (bounded by
confident learning's noise estimate) against cleanlab's default filter and the plain baseline (most probable class
is not the given label) on the same out-of-fold probabilities, and the audit's own quality figures (out-of-fold
accuracy, estimated noise rate, the self-check's estimated precision and recall, the probes' log-losses).

    python -m benchmarks.audit --work /tmp/audit-bench                 # full size: the table of docs/tools.md
    python -m benchmarks.audit --work /tmp/audit-bench --epochs 10     # a weak backbone: the anchor to beat, the warning
    python -m benchmarks.audit --work /tmp/audit-bench --clean         # digits as they are: at most 1 % flagged

Targets: label issues recall >= 0.9 at precision >= 0.8; with a weak backbone at least the recall and precision of
the anchor (`pixel_anchor`: cleanlab's default filter on 5-fold logistic regression over raw pixels) and the
warning; without faults at most 1 % flagged; leaks 20/20 with at most 5 other images flagged; outliers 10/10
within the 20 highest scores.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

TARGETS = {"label_issue": (0.9, 0.8), "leak": (20, 5), "outlier": (10, 20)}


def inject_faults(clean: str | os.PathLike, root: str | os.PathLike, seed: int = 0, flip: float = 0.05,
                  leaks: int = 20, noise: int = 10) -> dict[str, list[str]]:  # fmt: skip
    """Copy the digits folder `clean` (train/, test/) to `root` with faults: `flip` of the training images moved to
    another class folder, `leaks` test images written into train (same class) at 2-3x the size as JPEG of
    quality 60-90, `noise` images of uniform noise in random class folders. Returns the real paths of each kind."""
    rng = np.random.default_rng(seed)
    clean, root = Path(clean), Path(root)
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(clean, root, ignore=shutil.ignore_patterns("*.json"))
    classes = sorted(p.name for p in (root / "train").iterdir())
    train = sorted((root / "train").glob("*/*.png"))
    truth: dict[str, list[str]] = {"label_issue": [], "leak": [], "outlier": []}
    for path in rng.choice(train, size=round(flip * len(train)), replace=False):
        other = rng.choice([c for c in classes if c != path.parent.name])
        moved = root / "train" / other / path.name
        path.rename(moved)
        truth["label_issue"].append(str(moved))
    test = sorted((root / "test").glob("*/*.png"))
    for path in rng.choice(test, size=leaks, replace=False):
        image = Image.open(path).convert("L")
        size = int(rng.integers(2, 4)) * image.width
        copy = root / "train" / path.parent.name / f"copy_{path.stem}.jpg"
        image.resize((size, size), Image.Resampling.BILINEAR).save(copy, "JPEG", quality=int(rng.integers(60, 91)))
        truth["leak"].append(str(copy))
    for i in range(noise):
        pixels = rng.integers(0, 256, (8, 8), dtype=np.uint8)
        path = root / "train" / str(rng.choice(classes)) / f"noise_{i}.png"
        Image.fromarray(pixels).save(path)
        truth["outlier"].append(str(path))
    return {kind: [os.path.realpath(p) for p in paths] for kind, paths in truth.items()}


def score(findings_csv: str | os.PathLike, truth: dict[str, list[str]]) -> dict[str, Any]:
    """Recall and precision per kind of the audit's findings.csv against the injected `truth`. Label issues:
    precision over the flagged images that are neither injected copies nor noise (a noise image's label is wrong
    too, and a copy's is right); leaks: the other training images flagged; outliers: how many of the injected ones
    are within the 20 highest scores."""
    with open(findings_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    by_kind: dict[str, list[str]] = {}
    for row in rows:  # findings.csv is sorted by score within each kind
        by_kind.setdefault(row["kind"], []).append(row["path"])
    result: dict[str, Any] = {}
    result["label_issue"] = label_scores(by_kind.get("label_issue", []), truth)
    leaks = set(by_kind.get("leak", []))
    result["leak"] = {"found": len(leaks & set(truth["leak"])), "of": len(truth["leak"]),
                      "others": len(leaks - set(truth["leak"]))}  # fmt: skip
    top = by_kind.get("outlier", [])[:20]
    result["outlier"] = {"in_top_20": len(set(top) & set(truth["outlier"])), "of": len(truth["outlier"]),
                         "flagged": len(by_kind.get("outlier", []))}  # fmt: skip
    result["duplicate"] = {"flagged": len(by_kind.get("duplicate", []))}
    return result


ANCHOR_SIZE = 8  # digits' own resolution: the images as they are, every copy and noise image brought back to it


def pixel_anchor(root: str | os.PathLike, truth: dict[str, list[str]] | None = None, seed: int = 0) -> dict[str, Any]:
    """The issue's anchor: cleanlab's default filter (`find_label_issues`) on 5-fold logistic regression (scikit-learn's
    defaults) over the raw grey pixels of `root`/train (each image resized to ANCHOR_SIZE a side, scaled to [0, 1]);
    its flags (real paths) and, with `truth`, their recall and precision as `score` counts them."""
    from cleanlab.filter import find_label_issues
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    paths = sorted(p for p in (Path(root) / "train").glob("*/*") if p.is_file())
    classes = sorted({p.parent.name for p in paths})
    labels = np.array([classes.index(p.parent.name) for p in paths])
    pixels = np.stack([np.asarray(Image.open(p).convert("L").resize((ANCHOR_SIZE, ANCHOR_SIZE), Image.Resampling.BILINEAR),
                                  np.float32).ravel() / 255 for p in paths])  # fmt: skip
    folds = StratifiedKFold(5, shuffle=True, random_state=seed)
    probabilities = cross_val_predict(LogisticRegression(max_iter=1000), pixels, labels, cv=folds, method="predict_proba")
    flagged = [os.path.realpath(paths[i]) for i in np.flatnonzero(find_label_issues(labels, probabilities, n_jobs=1))]
    result: dict[str, Any] = {"flagged_paths": flagged, "accuracy": float(np.mean(probabilities.argmax(1) == labels))}
    if truth is not None:
        result.update(label_scores(flagged, truth))
    return result


def label_scores(flagged: list[str], truth: dict[str, list[str]]) -> dict[str, Any]:
    """Recall and precision of flagged label issues (paths) against the injected flips, the injected copies and
    noise images aside (a noise image's label is wrong too, and a copy's is right)."""
    kept = set(flagged) - set(truth["leak"]) - set(truth["outlier"])
    found = len(kept & set(truth["label_issue"]))
    return {"recall": found / max(1, len(truth["label_issue"])), "precision": found / max(1, len(kept)),
            "flagged": len(kept)}  # fmt: skip


def measure(work: str | os.PathLike, seed: int = 0, epochs: int = 60, clean: bool = False, oof: Any = None,
            folds: int = 5) -> dict[str, Any]:  # fmt: skip
    """Write digits, inject the faults (not with `clean`), pre-train the backbone on the audited train folder
    (reused when `work` holds it), audit (with `oof`, `--oof finetune`'s settings: its candidate too, and its
    flags on its own probabilities scored as well); the scores, the anchor's and the audit's own quality figures."""
    from vit_ft.data.digits import write_digits_imagefolder
    from vit_ft.tools.audit import AuditOptions, run_audit
    from vit_ft.training.pretrain import pretrain_digits

    work = Path(work)
    digits = write_digits_imagefolder(work / "digits", seed=0)
    data = digits if clean else work / "faulted"
    truth = {"label_issue": [], "leak": [], "outlier": []} if clean else inject_faults(digits, data, seed=seed)
    backbone = work / f"backbone-{'clean-' if clean else ''}{epochs}"
    if not (backbone / "config.json").is_file():
        pretrain_digits(backbone, data / "train", epochs=epochs, seed=seed, progress=False)
    out = work / f"audit-{'clean-' if clean else ''}{epochs}{'-finetune' if oof else ''}"
    options = AuditOptions(folds=folds, seed=seed, device="cpu", bf16=False, oof=oof)
    with finetune_alone() as alone:
        record = run_audit(backbone, data, out, options, overwrite=True)
    result = score(out / "findings.csv", truth)
    if alone:
        result["label_issue_finetune_alone"] = label_scores(alone["flagged"], truth)
    for method, paths in record["compared"].items():  # the same probabilities, other rules
        result[f"label_issue_{method}"] = label_scores(paths, truth)
    anchor = pixel_anchor(data, truth, seed)
    result["anchor"] = {k: v for k, v in anchor.items() if k != "flagged_paths"}
    result["flagged_fraction"] = record["counts"]["label_issue"] / record["num_train_images"]
    result["counts"] = record["counts"]
    result["probe"] = record["probe"]
    result["quality"] = record["quality"]  # what the audit estimated of itself, beside what the truth measures
    return result


@contextlib.contextmanager
def finetune_alone() -> Iterator[dict[str, Any]]:
    """{"flagged": paths} that the audit's flagging gives on the k-fold fine-tunes' own out-of-fold probabilities
    (whether or not they were chosen), filled in while the audit runs: the candidate's recall and precision."""
    import vit_ft.tools.audit.run as audit_run
    from vit_ft.tools.audit.labels import label_issues

    alone: dict[str, Any] = {}
    original = audit_run.fold_finetune_probabilities

    def recording(oof: Any, model: str, images: list[Any], labels: np.ndarray, *rest: Any) -> np.ndarray:
        probabilities = original(oof, model, images, labels, *rest)
        if "flagged" not in alone:  # the first call: the given labels (later: the self-check's flipped ones)
            found, _ = label_issues(labels, probabilities)
            alone["flagged"] = [os.path.realpath(images[f.index]["path"]) for f in found]
        return probabilities

    audit_run.fold_finetune_probabilities = recording
    try:
        yield alone
    finally:
        audit_run.fold_finetune_probabilities = original


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True, help="Folder for the data, the backbone and the audit.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=60, help="Pre-training epochs of the backbone (10: a weak one).")
    parser.add_argument("--clean", action="store_true", help="Audit digits as they are (no faults injected).")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--oof", choices=("probes", "finetune"), default="probes", help="As vit-ft audit's.")
    parser.add_argument("--oof_method", help="As vit-ft audit's.")
    parser.add_argument("--oof_steps", type=int, help="As vit-ft audit's.")
    parser.add_argument("--oof_flags", help="As vit-ft audit's.")
    parser.add_argument("--oof_pick", help="As vit-ft audit's.")
    args = parser.parse_args(argv)
    from vit_ft.commands.audit import oof_finetune

    result = measure(args.work, args.seed, args.epochs, args.clean, oof_finetune(args), args.folds)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
