"""Argument dataclasses for `transformers.HfArgumentParser`, used next to `transformers.TrainingArguments`.

Recipes (`recipes/*.yaml`) are flat mappings whose keys are exactly the field names below or those of
`TrainingArguments` (`FineTuneTrainingArguments`); `vit_ft.arguments.recipes.parse_args` merges a recipe with
command-line flags and builds the three (HfArgumentParser.parse_dict). Each `__post_init__` first checks its
numbers against their ranges (`vit_ft.arguments.ranges.RANGES`, the one table of them), then what else its own
fields can tell, `ModelArguments` the image size against its checkpoint too (the model layer's one check,
`vit_ft.model.checks.check_image_size`); the checks across dataclasses and against the launch are in
`vit_ft.arguments.checks`. Every mistake is a ValueError (`checks.RecipeError` from the range table).
"""

import re
from dataclasses import dataclass

from ..data.builtin import BUILTIN_DATASETS
from ..metrics.multilabel import PROBLEM_TYPES
from ..model.checks import (
    FINETUNE_WORDING,
    check_image_size,
    config_patch,
    max_image_tokens,
    read_local_config,
)
from ..model.configuration_vit_ft import POOLING_CHOICES
from .augmentation_arguments import AugmentationArguments
from .family_defaults import FAMILY_DEFAULTS, check_recipe_family
from .help import option
from .method_defaults import LORA_KEY_METHODS  # the methods that read the lora_* keys
from .pass_arguments import PassArguments
from .prompt_arguments import PromptArguments
from .ranges import check_ranges

LORA_TARGET_PRESETS = ("attention", "attention+mlp")
# how the model learns: all weights, LoRA adapters, a probe on frozen features (training/probes.py), or the
# ladder that tries them cheapest first (training/ladder.py)
METHOD_CHOICES = ("full", "lora", "linear", "knn", "auto", "zeroshot", "lp-ft", "dora", "vera", "oft", "boft", "loha", "lokr", "adalora",
                  "ia3", "ln_tuning", "ssf", "vpt")  # fmt: skip
# the methods that train a peft adapter (training/peft_methods.py holds each one's peft config and defaults);
# LoRA's variants read the lora_* keys, the others peft_r and peft_target_modules
PEFT_METHODS = ("lora", "dora", "vera", "oft", "boft", "loha", "lokr", "adalora", "ia3", "ln_tuning")
BUILTIN_PRETRAININGS = ("digits", "digits-small")
HEAD_INITS = ("zero", "zeroshot")  # the new head at zero (the paper), or an image-text model's zero-shot classifier

# A module name as peft matches it: dotted path segments of letters, digits and underscores.
_MODULE_NAME = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$")


def _check_choice(name: str, value: str | None, choices: tuple[str, ...], allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value not in choices:
        allowed = ", ".join(choices) + (" (or leave unset)" if allow_none else "")
        raise ValueError(f"{name}={value!r} is not supported; use one of: {allowed}.")


def parse_lora_target_modules(value: str) -> str | list[str]:
    """Return a preset name ("attention", "attention+mlp") unchanged, or a custom list split into module names."""
    if value in LORA_TARGET_PRESETS:
        return value
    return [name.strip() for name in value.split(",")]


@dataclass
class ModelArguments(PromptArguments):
    """What to fine-tune: the checkpoint, its fine-tuning resolution and head, and the optional LoRA setup."""

    model_name_or_path: str = option(
        "google/vit-base-patch16-224-in21k", "Hub id or local folder of the pre-trained ViT checkpoint."
    )
    image_size: int | None = option(
        None,
        "Fine-tuning resolution in pixels (a multiple of the patch size); position embeddings are "
        "resampled to it. None keeps the checkpoint's resolution.",
    )
    pooling: str | None = option(
        None,
        f"How the head pools the tokens: one of {', '.join(POOLING_CHOICES)}; unset keeps the "
        "checkpoint's own (cls for ViT, DeiT and CLIP, cls+mean for DINOv2, map for SigLIP).",
    )
    max_num_patches: int | None = option(
        None,
        "NaFlex (SigLIP 2): each image keeps its aspect ratio, resized to at most this many patches, "
        "padded and masked, in training, evaluation and prediction. Unset keeps the checkpoint's own (its "
        "num_patches for SigLIP 2, square image_size crops for the others).",
    )
    hidden_dropout_prob: float = option(
        0.0, "Dropout on embeddings and MLP/attention outputs (the ViT paper fine-tunes with 0)."
    )
    attention_probs_dropout_prob: float = option(0.0, "Dropout on the attention weights.")
    fc_norm: bool | None = option(
        None,
        "Normalise the pooled token instead of every token (MAE's fine-tuning layout, with pooling "
        "mean): the checkpoint's final LayerNorm is replaced by a new one after the pooling. None keeps the "
        "checkpoint's own layout.",
    )
    drop_path_rate: float | None = option(
        None,
        "Stochastic depth: each block's residual branches are dropped per sample with a probability "
        "rising linearly from 0 at the first block to this at the last (DeiT/BEiT fine-tune with 0.1); "
        "inactive in evaluation. None keeps the checkpoint's own value (0 for a plain ViT), 0 turns it off.",
    )
    recipe_family: str | None = option(
        None,
        "The ViT family whose fine-tuning protocol the recipe's optimisation values follow (one of "
        f"{', '.join(FAMILY_DEFAULTS)}). When --model_name_or_path names a checkpoint of another family, that "
        "family's defaults (docs/model.md) replace them, except keys given as flags. None: the family of the "
        "recipe's own model_name_or_path.",
    )
    method: str | None = option(
        None,
        "How the model learns: 'full' (all weights), 'lora' (= use_lora: true) or another peft adapter "
        "('dora', 'vera', 'oft', 'boft', 'loha', 'lokr', 'adalora', 'ia3', 'ln_tuning'; docs/fine-tuning.md), "
        "'ssf' (a scale and shift after each op of the frozen backbone, folded into the weights), 'vpt' (VPT's "
        "prompt tokens), 'linear' (a logistic regression head on the frozen backbone's features) or 'knn' "
        "(DINOv2's weighted k-nearest-neighbour vote over the training features, stored in the model), or "
        "'auto' (the ladder: kNN and linear probe, then LoRA, then full, each taken while the one before "
        "gained more than ladder_min_gain), or 'zeroshot' (an image-text checkpoint's classifier from the "
        "class names, no training: zeroshot_templates), or 'lp-ft' (Kumar et al. 2022: the linear probe fitted "
        "first, then full fine-tuning from its head). Unset: 'lora' when use_lora is true, else 'full'.",
    )
    ladder_min_gain: float = option(
        1.0,
        "method auto: the validation gain (accuracy or mAP points, 1.0 = one percentage point) a rung "
        "must make over the rungs below it for the ladder to try the next, costlier one.",
    )
    budget_minutes: float | None = option(
        None, "method auto: no further rung starts once this many minutes are spent (unset: no limit)."
    )
    use_lora: bool | None = option(
        None, "Train LoRA adapters (plus the classification head) instead of all weights."
    )
    lora_r: int = option(16, "LoRA rank.")
    lora_alpha: int = option(16, "LoRA scaling numerator (scale = lora_alpha / lora_r).")
    lora_dropout: float = option(0.1, "Dropout on the LoRA branch input.")
    lora_target_modules: str = option(
        "attention",
        "Where LoRA goes: 'attention' (attention projections), 'attention+mlp', or a comma-separated "
        "list of module names (e.g. 'query,value').",
    )
    peft_r: int | None = option(
        None,
        "The rank of the peft methods other than LoRA's (vera, loha, lokr: r; oft and boft: the block size); "
        "unset takes the method's default (docs/fine-tuning.md). lora, dora and adalora read lora_r.",
    )
    peft_target_modules: str | None = option(
        None,
        "Where the peft methods other than LoRA's go: 'attention', 'attention+mlp' or module names; unset takes "
        "the method's default (ia3: qkv and fc2, ln_tuning: the LayerNorms). lora, dora and adalora read "
        "lora_target_modules.",
    )
    merge_lora: bool = option(
        True, "Merge the adapter (any peft method) into the base model before saving, so the output loads "
        "without peft.",
    )
    pretrain_if_missing: str | None = option(
        None,
        "Name of a built-in pre-training ('digits' or 'digits-small'): build the checkpoint at model_name_or_path "
        "when that local path does not exist. A recipe's builds the recipe's own checkpoint: a "
        "--model_name_or_path flag names one that must exist, unless this flag is given too.",
    )
    head_init: str = option(
        "zero",
        "How the new head starts: 'zero' (the ViT paper's) or 'zeroshot' (an image-text checkpoint's classifier "
        "from the class names: CLIP, MetaCLIP 2, SigLIP, SigLIP 2; WiSE-FT's and LP-FT's start).",
    )
    zeroshot_templates: str = option(
        "openai",
        "method zeroshot / head_init zeroshot: the prompts each class name fills, averaged: 'openai' (the CLIP "
        "paper's 80), 'simple' (its 7), 'photo' ('a photo of a {}.') or a text file of one template a line.",
    )
    class_prompts: str | None = option(
        None, "A JSON file {class name: [prompt, ...]}: those classes' own prompts in place of the templates."
    )
    cache_dir: str | None = option(None, "Where to cache checkpoints and datasets downloaded from the Hub.")

    def __post_init__(self):
        check_ranges(self)  # image size, dropouts, LoRA rank and alpha
        if not self.model_name_or_path:
            raise ValueError("model_name_or_path is empty; set it to a Hub id or a local checkpoint folder.")
        _check_choice("pooling", self.pooling, POOLING_CHOICES, allow_none=True)
        check_recipe_family(self.recipe_family)
        if self.fc_norm and self.pooling == "cls+mean":
            raise ValueError(
                "fc_norm=true normalises one pooled token, not pooling 'cls+mean'; use pooling mean (MAE's layout), "
                "cls or map with it, or fc_norm false."
            )
        self.lora_target_modules = self._normalise_lora_targets(self.lora_target_modules)
        self._resolve_method()
        _check_choice("head_init", self.head_init, HEAD_INITS)
        if self.method == "lp-ft" and self.head_init != "zero":
            raise ValueError(f"method lp-ft fits its own head (the linear probe) before fine-tuning; head_init "
                             f"{self.head_init} would be replaced: leave head_init unset, or use method full.")  # fmt: skip
        if "zeroshot" in (self.method, self.head_init):  # a local checkpoint, before any data is read
            from ..model.zeroshot import check_local_text_tower

            check_local_text_tower(self.model_name_or_path)
        if "zeroshot" not in (self.method, self.head_init) and self.class_prompts:
            raise ValueError("class_prompts are the prompts of a zero-shot head: add --method zeroshot or "
                             "--head_init zeroshot, or drop class_prompts.")  # fmt: skip
        _check_choice("pretrain_if_missing", self.pretrain_if_missing, BUILTIN_PRETRAININGS, allow_none=True)
        if self.image_size is not None:  # against the checkpoint's patch (read only when local) and the bound
            patch = config_patch(read_local_config(self.model_name_or_path, self.cache_dir))
            name = self.model_name_or_path
            check_image_size(self.image_size, patch, max_image_tokens(), FINETUNE_WORDING, name=name)

    def _resolve_method(self) -> None:
        """`method` and `use_lora` agree (one follows from the other when only one is given), or one line."""
        _check_choice("method", self.method, METHOD_CHOICES, allow_none=True)
        if self.method is None:
            self.method = "lora" if self.use_lora else "full"
        elif self.use_lora is not None and self.use_lora != (self.method == "lora"):
            raise ValueError(
                f"method={self.method!r} and use_lora={str(self.use_lora).lower()} disagree: give one of them "
                f"({'method: lora means use_lora: true' if self.method == 'lora' else 'use_lora: true is method: lora'})."
            )
        self.use_lora = self.method == "lora"
        self._check_method_keys()
        if self.budget_minutes is not None and self.method != "auto":
            raise ValueError(
                f"budget_minutes={self.budget_minutes:g} limits the ladder of method: auto, not method: {self.method}; "
                "add --method auto or leave budget_minutes unset."
            )

    @property
    def peft(self) -> bool:
        """Whether the method trains a peft adapter (saved in `adapter/`, merged into the output by default)."""
        return self.method in PEFT_METHODS

    def _check_method_keys(self) -> None:
        """The keys of one method family are not given to another: lora_* to lora / dora / adalora, peft_* to the
        other peft methods (a key left at its default is not given)."""
        given_lora = [key for key, default in _LORA_KEY_DEFAULTS.items() if getattr(self, key) != default]
        given_peft = [key for key in ("peft_r", "peft_target_modules") if getattr(self, key) is not None]
        if self.method in PEFT_METHODS and self.method not in LORA_KEY_METHODS and given_lora:
            raise ValueError(
                f"{', '.join(given_lora)} set LoRA's adapters, not method: {self.method}; use peft_r / "
                "peft_target_modules for it, or leave the lora_* keys at their defaults."
            )
        if given_peft and self.method not in PEFT_METHODS:
            raise ValueError(
                f"{', '.join(given_peft)} set a peft method's adapters, not method: {self.method}; add --method "
                f"with one of {', '.join(m for m in PEFT_METHODS if m not in LORA_KEY_METHODS)}, or drop them."
            )
        if given_peft and self.method in LORA_KEY_METHODS:
            raise ValueError(
                f"{', '.join(given_peft)} are not read by method: {self.method}, which takes lora_r and "
                "lora_target_modules; use those instead."
            )
        self.check_prompt_keys(self.method)
        if self.peft_target_modules is not None:
            self.peft_target_modules = self._normalise_lora_targets(self.peft_target_modules, "peft_target_modules")

    @staticmethod
    def _normalise_lora_targets(value: str, name: str = "lora_target_modules") -> str:
        targets = parse_lora_target_modules(value.strip())
        if isinstance(targets, str):
            return targets
        bad = [name for name in targets if not _MODULE_NAME.match(name)]
        if bad:
            raise ValueError(
                f"{name}={value!r} has invalid module name(s) {bad}; use one of "
                f"{', '.join(LORA_TARGET_PRESETS)}, or a comma-separated list of module names such as 'query,value'."
            )
        return ",".join(targets)


# the LoRA keys' defaults: a key is "given" when it differs from its default
_LORA_KEY_DEFAULTS = {"lora_r": 16, "lora_alpha": 16, "lora_dropout": 0.1, "lora_target_modules": "attention"}


@dataclass
class DataArguments(AugmentationArguments, PassArguments):
    """Where the images come from (a Hub dataset or local class folders) and how they are augmented (the
    augmentation fields come from `AugmentationArguments`)."""

    dataset_name: str | None = option(
        None, "Hub dataset id (e.g. uoft-cs/cifar10). Exactly one of dataset_name / train_dir is set."
    )
    dataset_config: str | None = option(None, "Hub dataset configuration name, if any.")
    train_dir: str | None = option(
        None, "Local training image folder with one sub-folder per class (instead of dataset_name)."
    )
    validation_dir: str | None = option(
        None, "Local validation image folder (same class sub-folders as train_dir)."
    )
    test_dir: str | None = option(None, "Local test image folder (same class sub-folders as train_dir).")
    train_split: str = option("train", "Name of the Hub dataset's training split.")
    validation_split: str | None = option(
        "validation",
        "Name of the Hub dataset's validation split; when the dataset has none, "
        "validation_split_percentage of train is held out.",
    )
    test_split: str | None = option(
        None, "Name of the Hub dataset's test split, evaluated once after training (None: skip)."
    )
    image_column: str = option("image", "Column holding the images.")
    label_column: str = option(
        "label",
        "Column holding the labels: one class (id or name) per image, or several (a list of class "
        "names or ids, Sequence(ClassLabel), or a multi-hot 0/1 list) for multi-label classification.",
    )
    problem_type: str | None = option(
        None,
        "single_label_classification or multi_label_classification (several labels or none per "
        "image; BCE loss, mAP). Unset: chosen from the data (a list-valued label column or labels.csv).",
    )
    class_names: list[str] | None = option(
        None,
        "Multi-label: the label names of a multi-hot label column, in its order (YAML list or "
        "comma-separated); other columns name their labels themselves.",
    )
    label_separator: str = option(
        ";", "Multi-label image folders: the labels' separator in labels.csv's labels cell."
    )
    validation_split_percentage: float = option(
        0.1,
        "Fraction of train held out for validation (seeded, stratified) when there is no validation "
        "split or folder (0.1 holds out a tenth).",
    )
    max_train_samples: int | None = option(
        None, "Truncate the training set to this many examples (quick runs and debugging)."
    )
    max_eval_samples: int | None = option(
        None, "Truncate the validation and test sets to this many examples."
    )
    exclude: str | None = option(
        None,
        "A vit-ft audit findings.csv (the training images it names are dropped) or relabel.csv (each "
        "row dropped, relabelled or kept, as its action column says), applied before training.",
    )
    crop_scale_min: float = option(
        0.08, "Lower bound of the random-resized-crop area scale (Inception-style crops use 0.08)."
    )
    horizontal_flip: bool = option(
        True, "Random horizontal flips in training (turn off for data that is not mirror symmetric)."
    )
    builtin_dataset: str | None = option(
        None,
        "Name of a built-in dataset (only 'digits': scikit-learn's handwritten digits) written as image "
        "folders to train_dir/test_dir when they are missing.",
    )
    streaming: bool = option(
        False,
        "Stream dataset_name (a Hub dataset, or a folder of webdataset .tar shards) instead of "
        "downloading it whole: shuffled by shard and buffer, split across processes and workers, trained "
        "for max_steps (derived from the size the metadata states when unset); evaluation splits are read once.",
    )
    check_images: bool = option(
        True,
        "Scan each split of up to 20,000 images for undecodable files before training and drop "
        "them, reporting them all at once (larger or streamed splits: a training image that does not "
        "decode is always skipped where it is decoded, counted and named in vit_ft_run.json).",
    )
    max_bad_image_fraction: float = option(
        0.01,
        "Fail the run (one line) once more than this fraction of the training images are skipped "
        "because they do not decode, e.g. 0.01; 0 fails on the first one, 1 never fails.",
    )

    def __post_init__(self):
        super().__post_init__()  # every number's range first (check_ranges), then the augmentation's choices
        if self.dataset_name and self.train_dir:
            raise ValueError(
                f"Both dataset_name={self.dataset_name!r} and train_dir={self.train_dir!r} are set; choose one data "
                "source (pass --dataset_name none to use the folders, or --train_dir none to use the Hub dataset)."
            )
        _check_choice("builtin_dataset", self.builtin_dataset, BUILTIN_DATASETS, allow_none=True)
        _check_choice("problem_type", self.problem_type, PROBLEM_TYPES, allow_none=True)
        if isinstance(self.class_names, str):
            self.class_names = [name.strip() for name in self.class_names.split(",")]
        if self.class_names is not None and (
            len(set(self.class_names)) != len(self.class_names) or "" in self.class_names
        ):
            raise ValueError(f"class_names={self.class_names!r} must be distinct, non-empty label names.")
        if not self.label_separator:
            raise ValueError(
                "label_separator is empty; set it to the character between labels in labels.csv (';')."
            )
        if self.builtin_dataset and not self.train_dir:
            raise ValueError(
                f"builtin_dataset={self.builtin_dataset!r} writes image folders to train_dir/test_dir; "
                f"set train_dir (e.g. data/{self.builtin_dataset}/train) and test_dir."
            )
        if not self.dataset_name and not self.train_dir:
            raise ValueError(
                "No training data: set dataset_name (a Hub dataset id, e.g. uoft-cs/cifar10) or train_dir (a folder "
                "with one sub-folder per class), or pick a recipe with --recipe (see --list-recipes)."
            )
        if self.dataset_name and (self.validation_dir or self.test_dir):
            raise ValueError(
                "validation_dir/test_dir are local folders that go with train_dir, but dataset_name is set; "
                "use validation_split/test_split to name the Hub dataset's splits instead."
            )
        if not self.train_split:
            raise ValueError("train_split is empty; set it to the training split's name (usually 'train').")
        if not self.image_column or not self.label_column:
            raise ValueError(
                "image_column and label_column must name dataset columns (e.g. 'image' and 'label')."
            )
