"""The benchmark suites as one data table: VTAB-1k's 19 tasks and the five FGVC sets, each a `TaskSpec` (where
its images are on the Hub, which columns, which group), and the published rows the results are set beside.

VTAB-1k (Zhai et al. 2019, arXiv 1910.04867): per task 800 training and 200 validation images drawn from the
training split (the first 800 and the next 200, as VTAB's `train800` / `val200`), scored on the task's standard
test split; the mean over the 19 tasks is the headline, the three groups (natural / specialized / structured)
beside it. FGVC (VPT's five sets, Jia et al. 2022): the full training split with a seeded 10 % held out for
validation (VPT's own split files are not on the Hub), scored on the test split.

The Hub copies: the VTAB tasks as `clip-benchmark` publishes them (webdataset shards, `webp` image and `cls`
label, built from tfds with VTAB's own task definitions: dSprites / KITTI / CLEVR-distance binned as VTAB bins
them); the FGVC sets where a Hub copy with image / label columns is known. No id here was opened from the host
these tables were written on (no network): a revision of None is resolved once, at the first run, to the
commit the Hub then serves, and written to the suite's `datasets.lock.json`, which every later cell reads (a
`--dataset TASK=ID@REV` pins one by hand). A task without a known copy (NABirds) is refused by name until
`--dataset` gives one.
"""

from __future__ import annotations

from dataclasses import dataclass

NATURAL, SPECIALIZED, STRUCTURED, FINE_GRAINED = "natural", "specialized", "structured", "fgvc"


@dataclass(frozen=True)
class TaskSpec:
    """One task of a suite: its Hub dataset (id, config, revision), its columns and splits, its group."""

    name: str  # V-PETL Bench's name of the task (its scripts' --dataset)
    group: str
    hub_id: str | None  # None: no Hub copy known; `--dataset NAME=ID[@REV]` gives one
    image_column: str = "webp"
    label_column: str = "cls"
    train_split: str = "train"
    test_split: str = "test"
    config: str | None = None
    revision: str | None = None  # None: pinned at the first run (datasets.lock.json)


def _vtab(name: str, group: str, clip_benchmark: str) -> TaskSpec:
    return TaskSpec(name, group, f"clip-benchmark/wds_{clip_benchmark}")


VTAB1K = (
    _vtab("cifar100", NATURAL, "vtab-cifar100"),
    _vtab("caltech101", NATURAL, "vtab-caltech101"),
    _vtab("dtd", NATURAL, "vtab-dtd"),
    _vtab("oxford_flowers102", NATURAL, "vtab-flowers"),
    _vtab("oxford_iiit_pet", NATURAL, "vtab-pets"),
    _vtab("svhn", NATURAL, "vtab-svhn"),
    _vtab("sun397", NATURAL, "sun397"),
    _vtab("patch_camelyon", SPECIALIZED, "vtab-pcam"),
    _vtab("eurosat", SPECIALIZED, "vtab-eurosat"),
    _vtab("resisc45", SPECIALIZED, "vtab-resisc45"),
    _vtab("diabetic_retinopathy", SPECIALIZED, "vtab-diabetic_retinopathy"),
    _vtab("clevr_count", STRUCTURED, "vtab-clevr_count_all"),
    _vtab("clevr_dist", STRUCTURED, "vtab-clevr_closest_object_distance"),
    _vtab("dmlab", STRUCTURED, "vtab-dmlab"),
    _vtab("kitti", STRUCTURED, "vtab-kitti_closest_vehicle_distance"),
    _vtab("dsprites_loc", STRUCTURED, "vtab-dsprites_label_x_position"),
    _vtab("dsprites_ori", STRUCTURED, "vtab-dsprites_label_orientation"),
    _vtab("smallnorb_azi", STRUCTURED, "vtab-smallnorb_label_azimuth"),
    _vtab("smallnorb_ele", STRUCTURED, "vtab-smallnorb_label_elevation"),
)
FGVC = (
    TaskSpec("CUB_200_2011", FINE_GRAINED, "bentrevett/caltech-ucsd-birds-200-2011", "image", "label"),
    TaskSpec("nabirds", FINE_GRAINED, None, "image", "label"),
    TaskSpec("OxfordFlower", FINE_GRAINED, "nelorth/oxford-flowers", "image", "label"),
    TaskSpec("StanfordDogs", FINE_GRAINED, "amaye15/stanford-dogs", "image", "label"),
    TaskSpec("StanfordCars", FINE_GRAINED, "tanganke/stanford_cars", "image", "label"),
)


@dataclass(frozen=True)
class Suite:
    """A suite: its tasks and how each task's training / validation images are drawn."""

    name: str
    tasks: tuple[TaskSpec, ...]
    train_size: int | None  # images for training (None: the training split less the held-out part)
    validation_size: int | None  # images held out for validation after them (None: validation_fraction)
    validation_fraction: float = 0.0


SUITES = {
    "vtab1k": Suite("vtab1k", VTAB1K, train_size=800, validation_size=200),
    "fgvc": Suite("fgvc", FGVC, train_size=None, validation_size=None, validation_fraction=0.1),
}

# V-PETL Bench (Xin et al., NeurIPS 2024 datasets track), ViT-B/16 ImageNet-21k, README of
# github.com/synbol/Parameter-Efficient-Transfer-Learning-Benchmark at c188fad: top-1 per task in the order of
# the suite's tasks. Adapter+ (Steitz & Roth, CVPR 2024, "Adapters Strike Back") reports only its VTAB-1k mean
# here (77.6, as issue 47 quotes it; its per-task row was not checked against the paper from this host).
V_PETL = "V-PETL Bench (README at c188fad)"
PUBLISHED: dict[str, dict[str, tuple[float, ...]]] = {
    "vtab1k": {
        "full": (68.9, 87.7, 64.3, 97.2, 86.9, 87.4, 38.8, 79.7, 95.7, 84.2, 73.9, 56.3, 58.6, 41.7, 65.5, 57.5, 46.7, 25.7, 29.1),
        "linear": (63.4, 85.0, 63.2, 97.0, 86.3, 36.6, 51.0, 78.5, 87.5, 68.6, 74.0, 34.3, 30.6, 33.2, 55.4, 12.5, 20.0, 9.6, 19.2),
        "vpt-shallow": (77.7, 86.9, 62.6, 97.5, 87.3, 74.5, 51.2, 78.2, 92.0, 75.6, 72.9, 50.5, 58.6, 40.5, 67.1, 68.7, 36.1, 20.2, 34.1),
        "vpt-deep": (78.8, 90.8, 65.8, 98.0, 88.3, 78.1, 49.6, 81.8, 96.1, 83.4, 68.4, 68.5, 60.0, 46.5, 72.8, 73.6, 47.9, 32.9, 37.8),
        "lora": (67.1, 91.4, 69.4, 98.8, 90.4, 85.3, 54.0, 84.9, 95.3, 84.4, 73.6, 82.9, 69.2, 49.8, 78.5, 75.7, 47.1, 31.0, 44.0),
        "ssf": (69.0, 92.6, 75.1, 99.4, 91.8, 90.2, 52.9, 87.4, 95.9, 87.4, 75.5, 75.9, 62.3, 53.3, 80.6, 77.3, 54.9, 29.5, 37.9),
    },
    "fgvc": {
        "full": (87.3, 82.7, 98.8, 89.4, 84.5),
        "linear": (85.3, 75.9, 97.9, 86.2, 51.3),
        "vpt-shallow": (86.7, 78.8, 98.4, 90.7, 68.7),
        "vpt-deep": (88.5, 84.2, 99.0, 90.2, 83.6),
        "lora": (85.6, 79.8, 98.9, 87.6, 72.0),
        "ssf": (89.5, 85.7, 99.6, 89.6, 89.2),
    },
}  # fmt: skip
# a published mean without its per-task row
PUBLISHED_MEANS = {"vtab1k": {"adapter+ (Steitz & Roth 2024)": 77.6}}


def suite(name: str) -> Suite:
    """The suite `name`, or a ValueError naming the suites."""
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; use one of: {', '.join(SUITES)} (e.g. vit-ft bench vtab1k).")
    return SUITES[name]


__all__ = ["FGVC", "PUBLISHED", "PUBLISHED_MEANS", "SUITES", "V_PETL", "VTAB1K", "Suite", "TaskSpec", "suite"]
