"""The run plan: what a fine-tune will do, decided before it trains, as one frozen value.

`recipes.build_plan(argv)` merges recipe -> flags -> family defaults exactly as `parse_args` does (it is the same merge,
with each layer kept), runs the same checks, and gathers what the run will read and write: where every value came
from, the data source, the input spec, the task, the method, the batch split, the output folder's state and every
pass the run makes besides training, with its size. `vit-ft finetune --print_plan` prints it and exits before any
data or model is loaded; the run record keeps `RunPlan.record()`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..data.naflex import describe_inputs
from ..utils.hardware import Compute, compute_for
from .global_batch import batch_record
from .merge import TRAINING_DEFAULTS
from .precision import precision_of

if TYPE_CHECKING:
    from transformers import TrainingArguments

    from .fields import DataArguments, ModelArguments

# where a value came from, in the order the merge applies them (a later layer wins)
SOURCES = ("vit-ft default", "method defaults", "recipe", "family defaults", "flag", "derived")


@dataclasses.dataclass(frozen=True)
class Pass:
    """A pass the run makes over images besides training: its name, what it reads and how many (an upper bound
    where the data decide), and the key that sizes or skips it."""

    name: str
    reads: str
    size: str
    key: str | None = None

    def describe(self) -> str:
        return f"{self.name}: {self.reads}, {self.size}" + (f" (key: {self.key})" if self.key else "")


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """Every decision a fine-tune makes before it trains. Built once by `build_plan`; read, never changed."""

    recipe: str | None
    model_args: ModelArguments
    data_args: DataArguments
    training_args: TrainingArguments
    sources: dict[str, str]  # every merged value's name -> where it came from (SOURCES)
    values: dict[str, Any]  # the merged values the argument dataclasses were built from
    # the family defaults taken over the recipe's values, and why (`family_defaults.choose_family_defaults`)
    family_defaults: dict[str, Any] | None = None
    recorded: dict[str, Any] | None = None  # `record()` as the plan was decided, before the run changed anything

    @property
    def arguments(self) -> tuple[ModelArguments, DataArguments, TrainingArguments]:
        return self.model_args, self.data_args, self.training_args

    def decided(self) -> RunPlan:
        """This plan with its record taken now, before the run writes anything (the run record keeps it)."""
        return dataclasses.replace(self, recorded=self.record())

    def with_arguments(self, model_args: Any = None, training_args: Any = None) -> RunPlan:
        """The plan of a run that differs in its model or training arguments, already checked (a ladder's rung, a
        sweep's run resumed), its record taken anew."""
        return dataclasses.replace(
            self, model_args=model_args or self.model_args, training_args=training_args or self.training_args
        ).decided()

    @property
    def data(self) -> str:
        """The data source in words: folder, Hub dataset, stream or built-in."""
        args = self.data_args
        streamed = " (streamed)" if args.streaming else ""
        if args.builtin_dataset:
            return f"built-in {args.builtin_dataset}, written to {args.train_dir}"
        if args.dataset_name:
            config = f" ({args.dataset_config})" if args.dataset_config else ""
            return f"Hub dataset {args.dataset_name}{config}{streamed}"
        return f"image folders {args.train_dir}{streamed}" + (
            f", test {args.test_dir}" if args.test_dir else ""
        )

    @property
    def inputs(self) -> str:
        """The input spec: a square resolution, or a patch budget (`data.input_spec.describe_inputs`)."""
        return describe_inputs(self.model_args.image_size, self.model_args.max_num_patches)

    @property
    def task(self) -> str:
        return (
            self.data_args.problem_type or "from the data (single-label; multi-label where labels are lists)"
        )

    @property
    def method(self) -> str:
        method, lora = self.model_args.method, self.model_args.use_lora
        return "lora" if lora and method in (None, "full") else str(method or "full")

    @property
    def batch(self) -> dict[str, Any]:
        return batch_record(self.training_args)

    @property
    def outputs(self) -> str:
        """The output folder's state now: new, a finished run, or an unfinished one with its checkpoints."""
        folder = Path(self.training_args.output_dir)
        resume = self.training_args.resume_from_checkpoint
        if not folder.exists():
            return f"{folder}: new"
        checkpoints = sorted(path.name for path in folder.glob("checkpoint-*") if path.is_dir())
        finished = (folder / "vit_ft_run.json").is_file() and (folder / "config.json").is_file()
        state = "a finished run" if finished else f"{len(checkpoints)} checkpoint(s)"
        return f"{folder}: holds {state}" + (f"; resume from {resume}" if resume else "")

    @property
    def compute(self) -> Compute:
        """Device, precision and kernels, and why (the CPU's native bf16 or its emulation)."""
        return run_compute(self.training_args)

    @property
    def passes(self) -> tuple[Pass, ...]:
        return run_passes(self)

    def record(self) -> dict[str, Any]:
        """The plan as the run record keeps it (JSON values)."""
        return {
            "recipe": self.recipe,
            "sources": dict(self.sources),
            "data": self.data,
            "inputs": self.inputs,
            "task": self.task,
            "method": self.method,
            "batch": self.batch,
            "outputs": self.outputs,
            "compute": self.compute.record(),
            "passes": [dataclasses.asdict(one) for one in self.passes],
        }

    def describe(self, unchecked: Sequence[str] = ()) -> str:
        """What `--print_plan` prints: the plan, then every merged value with where it came from. `unchecked`:
        the models and datasets it could not check without the network, each with why (`utils.hub_ids`)."""
        batch = self.batch
        lines = [
            f"Run plan{f' (recipe {self.recipe})' if self.recipe else ''}",
            f"  data:    {self.data}",
            f"  inputs:  {self.inputs}",
            f"  task:    {self.task}",
            f"  method:  {self.method}",
            f"  batch:   global {batch['global_batch']} = {batch['per_device_train_batch_size']} per device x "
            f"{batch['world_size']} process(es) x {batch['gradient_accumulation_steps']} accumulation",
            f"  outputs: {self.outputs}",
            *(f"  not checked: {one}" for one in unchecked),
            f"  compute: {self.compute.line().removeprefix('Compute: ')}",
            "  passes besides training:",
            *(f"    - {one.describe()}" for one in self.passes),
            "  values (name = value  [source]):",
        ]
        width = max(map(len, self.values), default=0)
        lines += [
            f"    {name:<{width}} = {self.values[name]!r}  [{self.sources[name]}]"
            for name in sorted(self.values)
        ]
        return "\n".join(lines)


def run_compute(training_args: Any, device_type: str | None = None) -> Compute:
    """The fine-tune's device, precision and kernels, and why (`utils.hardware.compute_for`): logged as one line
    at the start of the run (a warning where bf16 runs emulated) and kept in its run record as `compute`."""
    device, fp16, bf16 = precision_of(training_args, device_type)
    return compute_for(device, "bf16" if bf16 else "fp16" if fp16 else "float32")


def value_sources(
    recipe: dict[str, Any],
    family: dict[str, Any],
    flags: dict[str, Any],
    merged: dict[str, Any],
    method: dict[str, Any] | None = None,
) -> dict[str, str]:
    """Where each merged value came from: the last layer that gave it that value, else derived by the merge."""
    sources = {}
    for name, value in merged.items():
        layers = (
            (flags, "flag"),
            (family, "family defaults"),
            (recipe, "recipe"),
            (method or {}, "method defaults"),
            (TRAINING_DEFAULTS, SOURCES[0]),
        )
        given = [source for layer, source in layers if name in layer and layer[name] == value]
        sources[name] = given[0] if given else "derived"
    return sources


def _bank_pass(plan: RunPlan) -> Pass:
    """The feature bank's size by the rule the run applies (`pass_arguments.bank_images`), over what the arguments
    tell: `bank_max_images`, `max_train_samples` (else the limit stands for the split) and, for a run of
    `max_steps`, the images training sees (a probe takes no steps)."""
    from .pass_arguments import NO_BANK, bank_images

    limit, key = plan.data_args.bank_max_images, "bank_max_images"
    if not limit:
        return Pass("feature bank", "skipped", NO_BANK, key)
    steps = plan.training_args.max_steps
    trained = steps * plan.batch["global_batch"] if steps > 0 and plan.method not in ("linear", "knn", "zeroshot") else None
    count, _ = bank_images(limit, plan.data_args.max_train_samples or limit, trained)
    return Pass("feature bank", "training images, class-stratified, 2 feature vectors each",
                f"up to {count} images", key)  # fmt: skip


def run_passes(plan: RunPlan) -> tuple[Pass, ...]:
    """Every pass over images the run makes besides training, in order, with its size as far as the arguments
    tell (the data decide the rest: "up to")."""
    data, training = plan.data_args, plan.training_args
    evals = f"up to {data.max_eval_samples} images" if data.max_eval_samples else "every image"
    passes = []
    if data.check_images and not data.streaming:
        passes.append(
            Pass("bad-image scan", "every split's images, decoded once", "every image", "check_images")
        )
    if plan.method in ("linear", "knn", "auto", "lp-ft"):
        passes.append(
            Pass("probe features", "training and validation images, frozen backbone", "every image")
        )
    if "zeroshot" in (plan.method, plan.model_args.head_init):
        passes.append(Pass("zero-shot head", "each class's prompts, the checkpoint's text tower", "every class",
                           "zeroshot_templates"))  # fmt: skip
    passes.append(Pass("evaluation", "validation split, each eval step", evals, "max_eval_samples"))
    passes.append(Pass("calibration", "validation split (temperature or threshold fit)", evals))
    passes.append(_bank_pass(plan))
    if data.test_dir or data.test_split or data.builtin_dataset:
        passes.append(Pass("test evaluation", "test split, once at the end", evals, "max_eval_samples"))
    passes.append(Pass("examples and report figures", "a few validation images", "at most 16 images"))
    if training.push_to_hub:
        passes.append(Pass("push", "the finished output folder", "one upload"))
    return tuple(passes)


__all__ = ["SOURCES", "Pass", "RunPlan", "run_compute", "run_passes", "value_sources"]
