"""vit_ft.model: the configuration, named sizes, modeling and position embeddings (what a saved folder carries),
and the loading code around them: checkpoint formats (transformers ViT, timm, JAX), the weight conversion, the
loading report, the normalisation a checkpoint states, and the export.

Importing the package installs the loading hooks (`loading.py`) on the model and config classes and registers
them with transformers' Auto classes (`import vit_ft` alone imports nothing heavy: see vit_ft/__init__.py).
"""

from pathlib import Path

from transformers import AutoConfig, AutoModel, AutoModelForImageClassification

from . import loading  # noqa: F401
from .configuration_vit_ft import ViTFTConfig
from .modeling_vit_ft import ViTFTForImageClassification, ViTFTModel

AutoConfig.register("vit_ft", ViTFTConfig, exist_ok=True)
AutoModel.register(ViTFTConfig, ViTFTModel, exist_ok=True)
AutoModelForImageClassification.register(ViTFTConfig, ViTFTForImageClassification, exist_ok=True)
# save_pretrained copies the model code and writes auto_map, so folders load with trust_remote_code=True
ViTFTConfig.register_for_auto_class()
ViTFTModel.register_for_auto_class("AutoModel")
ViTFTForImageClassification.register_for_auto_class("AutoModelForImageClassification")


def code_files() -> dict[str, Path]:
    """name -> file of the model code a saved folder carries (what `save_pretrained` copies beside the weights):
    the config and model files with their relative imports, as transformers resolves them."""
    from transformers.dynamic_module_utils import get_relative_import_files

    from . import configuration_vit_ft, modeling_vit_ft

    files = [Path(configuration_vit_ft.__file__), Path(modeling_vit_ft.__file__)]
    files += [Path(p) for f in list(files) for p in get_relative_import_files(str(f))]
    return {path.name: path for path in sorted(set(files))}
