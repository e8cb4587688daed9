"""Share a fine-tune on the Hugging Face Hub: stage the output folder with a model card, then upload it.

Two formats, chosen by `hub_format.choose_format` unless asked for. "transformers" (the default wherever the model
is exactly transformers' `ViTForImageClassification`: a plain ViT with CLS pooling): the standard transformers
export (`vit_ft.model.export`), which loads with `pipeline()` and `AutoModelForImageClassification` and runs in
the Hub's widget, no remote code, with the calibration temperature folded into its head
(`tasks.temperature.fold_temperature`, after a LoRA merge) so that `pipeline()` gives the calibrated scores. "vit_ft" (where the model needs it, e.g. mean pooling, or `--format vit_ft`):
our weights and config with the model's code beside them and `auto_map`, so
`AutoModelForImageClassification.from_pretrained(repo, trust_remote_code=True)` loads it anywhere; a LoRA
adapter is shared too. Either way the repository gets the image processor at the fine-tuned resolution (resize
and centre crop, as our evaluation: `processor.evaluation_image_processor`), the
label maps, the run record and a model card saying which format it is and why; checkpoints, TensorBoard runs and
pickles (training_args.bin) stay local.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi

from ...data.images import image_extensions
from ...metrics.multilabel import THRESHOLD_ATTRIBUTE
from ...model import code_files
from ...reports.robustness import evaluation_shift
from ...tasks.card import model_card
from ...tasks.temperature import fold_temperature, folded_temperature_of
from ...utils.hub_ids import check_hub_id
from ...utils.output_dir import check_output_dir
from ...utils.run_record import ADAPTER_DIR, EXAMPLES_DIR, PROCESSOR_FILE, RUN_RECORD_FILE
from ..trained import Origin, load_trained, locate
from .hub_format import (
    AUTO,
    FORMAT_CHOICES,
    FORMATS,
    check_format,
    check_same_head,
    check_same_logits,
    choose_format,
)
from .processor import vit_image_processor, write_image_processor, write_staged_processor

logger = logging.getLogger("vit_ft")

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors")
# what the fine-tune recorded, shared in both formats
RECORD_FILES = ("labels.json", "training_curves.png", RUN_RECORD_FILE, "*_results.json", "trainer_state.json")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "config.json", PROCESSOR_FILE)


def stage_for_hub(
    output_dir: str | Path,
    staging_dir: str | Path,
    repo_id: str,
    format: str = AUTO,
    evaluation: str | Path | None = None,
) -> Path:
    """Write into `staging_dir` (created; must not exist) exactly what the Hub repository `repo_id` gets.

    `output_dir` is a fine-tune output folder (merged or full model at its root, and/or a LoRA adapter in
    `adapter/`) or a bare adapter folder. `format` is "auto" (transformers' class where the model is exactly
    one, else vit_ft: `hub_format.choose_format`), "transformers" or "vit_ft". A LoRA adapter that was not merged
    is merged here, so the repository always holds a complete model; the adapter itself is shared too (vit_ft
    format, in `adapter/`). The staged folder is verified (`verify_staged`; the transformers export also gives
    the source model's logits); on any failure it is removed. `evaluation`: the report folder of a `vit-ft evaluate
    --shift` of this model, whose shift table the card shows (`reports.robustness.evaluation_shift`).
    """
    check_hub_id(repo_id)
    check_format(format)
    output_dir, staging = Path(output_dir), Path(staging_dir)
    if not output_dir.is_dir():
        raise FileNotFoundError(
            f"{output_dir} is not a folder; pass a fine-tune output folder (--output_dir)."
        )
    check_output_dir(staging, flag="--local_dir", new="stage into a new folder")
    shift = evaluation_shift(evaluation, output_dir) if evaluation is not None else None
    origin = locate(output_dir)  # the folder's run record, adapter and processor, read once
    shared = choose_format(_config(origin), format)
    logger.info("Sharing %s in the %s format: %s.", output_dir, shared.name, shared.reason)
    try:  # a folder that cannot be staged and verified is removed: nothing half-written is left to upload
        reference = _stage_model(origin, staging, shared.name)
        _copy_matching(output_dir, staging, RECORD_FILES)
        examples = output_dir / EXAMPLES_DIR
        if examples.is_dir():
            _copy_matching(
                examples, staging / EXAMPLES_DIR, tuple(f"*{s}" for s in sorted(image_extensions()))
            )
        run_info = _run_info(origin)
        folded = folded_temperature_of(reference.config) if reference is not None else None
        card = model_card(
            run_info, repo_id, staging, shared.name, repo_id=repo_id, format_reason=shared.reason,
            folded_temperature=folded, shift=shift,
        )  # fmt: skip
        card.save(staging / "README.md")
        verify_staged(staging, shared.name, source=output_dir, reference=reference)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


def _config(origin: Origin):
    """The config of the model the folder holds (its adapter's for a LoRA run), read without its weights."""
    from ...model.configuration_vit_ft import ViTFTConfig

    return ViTFTConfig.from_pretrained(origin.adapter if origin.loads_adapter else origin.path)


def _stage_model(origin: Origin, staging: Path, format: str):
    """The model in `format` with its image processor (and, vit_ft format, its code and LoRA adapter); returns
    the exported model for the transformers format (the reference of `verify_staged`), else None."""
    folder = origin.path
    if format == "transformers":
        from ...model.export import export_to_transformers

        trained = load_trained(origin, device="cpu", merge_lora=True)  # merged first, then folded
        model = fold_temperature(trained.model, trained.task)  # pipeline() gives the calibrated scores
        export_to_transformers(model, staging, image_processor=vit_image_processor(origin))
        write_image_processor(origin, staging, model.config)  # as we evaluate
        return model
    ours, complete = code_files(), _has_complete_model(folder)
    _check_code(folder, _code_files(folder) if complete else [], ours)  # before anything is staged
    staging.mkdir(parents=True)
    if complete:
        _copy_matching(folder, staging, (*WEIGHT_FILES, "config.json"))
        for name, path in ours.items():  # the installed vit_ft's code, never the folder's
            shutil.copyfile(path, staging / name)
    else:  # an adapter only, or a folder saved without its code: write the model with its code
        _load_merged(origin).save_pretrained(staging)
    write_staged_processor(origin, staging)
    if origin.adapter is not None:  # its config's code too is the installed vit_ft's
        code = sorted(p.name for p in origin.adapter.glob("*.py"))
        _check_code(origin.adapter, code, ours)
        _copy_matching(origin.adapter, staging / ADAPTER_DIR, ADAPTER_FILES)
        for name in code:
            shutil.copyfile(ours[name], staging / ADAPTER_DIR / name)
    return None


def verify_staged(
    staging: Path, format: str = "vit_ft", source: Path | None = None, reference: Any = None
) -> None:
    """Open every weight file in `staging`, then load the model as its users will (transformers' key mapping
    included) and check that every parameter is there with the shape its config says and nothing is left
    over. A truncated or mismatched folder is an OSError or ValueError naming the file (in `source`, the folder
    it was copied from, when it is there) or the keys, raised before anything is uploaded. With `reference`
    (the model it was exported from), the staged model must also give its logits (`check_same_logits`) and keep
    its `problem_type` and multi-label decision threshold (`check_same_head`)."""
    from safetensors import safe_open

    if format == "transformers":  # the class config.json names (ViT, or a family's own)
        from transformers import AutoModelForImageClassification as model_class
    else:
        from ...model.modeling_vit_ft import ViTFTForImageClassification as model_class

    files = sorted(staging.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{staging} holds no .safetensors weights; the folder cannot be shared.")
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as weights:
                for key in weights.keys():  # noqa: SIM118 - safe_open is not iterable
                    weights.get_slice(key).get_shape()
        except Exception as error:  # safetensors raises its own error type, naming no file
            named = source / file.name if source is not None and (source / file.name).is_file() else file
            raise OSError(
                f"{named} cannot be read ({' '.join(str(error).split())}): the file is truncated or corrupt; "
                "save the model again (or re-run the fine-tune's final save) before sharing it."
            ) from error
    try:
        lenient = {} if format == "transformers" else {"strict": False}  # the keys are checked below
        staged, info = model_class.from_pretrained(staging, output_loading_info=True, **lenient)
    except RuntimeError as error:  # a size mismatch between the weights and config.json
        raise ValueError(
            f"the weights in {staging} do not load into the model its config.json describes "
            f"({' '.join(str(error).split())[:300]}); share the folder the fine-tune saved, unedited."
        ) from error
    problems = {k: sorted(info.get(k) or []) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if any(problems.values()):
        details = "; ".join(
            f"{k.replace('_', ' ')} {[str(v) for v in keys[:3]]}" for k, keys in problems.items() if keys
        )
        where = source if source is not None and (source / "config.json").is_file() else staging
        raise ValueError(
            f"the weights in {where} do not match its config.json ({details}); share the folder the fine-tune "
            "saved, unedited."
        )
    if reference is not None:
        check_same_logits(reference, staged, staging)
        check_same_head(reference, staged, staging)


def _check_online() -> None:
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        raise ConnectionError(
            "HF_HUB_OFFLINE is set: the push needs the network; unset HF_HUB_OFFLINE and connect, or stage the "
            "folder without the network with --local_dir FOLDER."
        )


def _is_transport_error(error: BaseException) -> bool:
    """A connection that failed (httpx's TransportError family, or the stdlib's ConnectionError)."""
    return isinstance(error, ConnectionError) or any(
        c.__name__ == "TransportError" for c in type(error).__mro__
    )


def push_output_dir(
    output_dir: str | Path,
    hub_model_id: str,
    format: str = AUTO,
    token: str | None = None,
    private: bool | None = None,
    commit_message: str = "Upload fine-tuned ViT with vit-ft",
    revision: str | None = None,
    evaluation: str | Path | None = None,
) -> str:
    """Push a fine-tune output folder to the Hub repository `hub_model_id` (created if missing); returns the commit URL.

    The repo id is checked and the folder staged and verified first (see `stage_for_hub`; `format` as there),
    then the network setting, so a folder that cannot be shared fails before the repository is created. `token` defaults to the logged-in user's (`hf auth login` or HF_TOKEN).
    """
    check_hub_id(hub_model_id)
    api = HfApi(token=token)
    with tempfile.TemporaryDirectory(prefix="vit_ft_push_") as tmp:
        staging = stage_for_hub(output_dir, Path(tmp) / hub_model_id.split("/")[-1], hub_model_id, format, evaluation)
        _check_online()  # after the folder's own problems, which the user fixes first
        try:  # the first network call: the staged folder is verified by now
            repo_url = api.create_repo(hub_model_id, private=private, exist_ok=True)
            info = api.upload_folder(
                repo_id=repo_url.repo_id,
                folder_path=staging,
                commit_message=commit_message,
                revision=revision,
            )
        except Exception as error:
            if not _is_transport_error(error):
                raise
            raise ConnectionError(
                f"cannot reach the Hub ({' '.join(str(error).split())}): the push needs the network; connect and "
                "run it again, or stage the folder without the network with --local_dir FOLDER."
            ) from error
    logger.info("Pushed %s to %s", output_dir, info.commit_url)
    return info.commit_url


def _run_info(origin: Origin) -> dict[str, Any]:
    """The run record, or what the folder itself says when it has none."""
    if origin.record is not None:
        return origin.record
    output_dir, adapter_dir = origin.path, origin.adapter
    logger.warning(
        "No %s in %s: the model card will not name the recipe or dataset.", RUN_RECORD_FILE, output_dir
    )
    config_dir = output_dir if (output_dir / "config.json").is_file() else adapter_dir or output_dir
    config = (
        json.loads((config_dir / "config.json").read_text()) if (config_dir / "config.json").is_file() else {}
    )
    size = config.get("image_size")
    metrics_path = output_dir / "all_results.json"
    threshold = config.get(THRESHOLD_ATTRIBUTE)  # a multi-label model's: the card states it
    return {
        "recipe": None,
        "base_model": None,
        "image_size": [size, size] if isinstance(size, int) else size,
        "lora": adapter_dir is not None,
        "data": {},
        "metrics": json.loads(metrics_path.read_text()) if metrics_path.is_file() else {},
        "problem_type": config.get("problem_type"),
        THRESHOLD_ATTRIBUTE: {"value": threshold} if threshold is not None else None,
    }


def _has_complete_model(folder: Path) -> bool:
    """Weights, a vit_ft config with auto_map, and every code file that auto_map needs."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        return False
    config = json.loads(config_path.read_text())
    has_weights = any(fnmatch.filter((p.name for p in folder.iterdir()), w) for w in WEIGHT_FILES)
    try:
        code = _code_files(folder)
    except FileNotFoundError:
        return False
    return config.get("model_type") == "vit_ft" and "auto_map" in config and has_weights and bool(code)


def _code_files(folder: Path) -> list[str]:
    """The .py files that `auto_map` loads, with their relative imports (transformers' own resolution)."""
    from transformers.dynamic_module_utils import get_relative_import_files

    auto_map = json.loads((folder / "config.json").read_text()).get("auto_map", {})
    modules = {ref.split(".")[0] for ref in auto_map.values() if isinstance(ref, str) and "--" not in ref}
    files: set[str] = set()
    for module in modules:
        path = folder / f"{module}.py"
        if not path.is_file():
            raise FileNotFoundError(f"auto_map names {module}.py, which is not in {folder}.")
        files.add(path.name)
        files.update(Path(p).name for p in get_relative_import_files(str(path)))
    return sorted(files)


# what a vit_ft folder's auto_map may name: the installed vit_ft's classes (save_pretrained writes these)
OUR_AUTO_MAP = {
    "configuration_vit_ft.ViTFTConfig",
    "modeling_vit_ft.ViTFTModel",
    "modeling_vit_ft.ViTFTForImageClassification",
}


def _check_code(folder: Path, names: list[str], ours: dict[str, Path]) -> None:
    """Refuse a folder whose model code (`names`) is not the installed vit_ft's: every user of the repository
    runs it with trust_remote_code=True, so a changed file (or an auto_map naming other code) is never
    published."""
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
    auto_map = config.get("auto_map", {})
    foreign = sorted(str(ref) for ref in auto_map.values() if ref not in OUR_AUTO_MAP)
    if foreign:
        raise ValueError(
            f"{config_file}: auto_map names code that is not vit_ft's ({', '.join(foreign)}); push "
            "publishes only the installed vit_ft's model code. Restore the config.json the fine-tune saved."
        )
    for name in names:
        if name not in ours or (folder / name).read_bytes() != ours[name].read_bytes():
            raise ValueError(
                f"{folder / name} differs from the model code of the installed vit_ft ({ours.get(name, 'none')}); "
                "push publishes only vit_ft's own code, which users run with trust_remote_code=True. Restore the "
                f"file, or delete the folder's .py files and push again (vit_ft then writes its own)."
            )


def _load_merged(origin: Origin):
    """The classifier to share: the folder's model, or base + LoRA adapter with the adapter merged in."""
    return load_trained(origin, device="cpu", merge_lora=True).model


def _copy_matching(source: Path, target: Path, patterns: tuple[str, ...]) -> None:
    """Copy the files directly in `source` whose names match `patterns` (no subfolders)."""
    for path in sorted(source.iterdir()):
        if path.is_file() and any(fnmatch.fnmatch(path.name, p) for p in patterns):
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target / path.name)


__all__ = [
    "AUTO",
    "FORMATS",
    "FORMAT_CHOICES",
    "check_same_logits",
    "push_output_dir",
    "stage_for_hub",
    "verify_staged",
]
