"""vit-ft: fine-tune Vision Transformers on the Hugging Face stack."""

from transformers import AutoConfig, AutoModel, AutoModelForImageClassification

from .model.configuration_vit_ft import ViTFTConfig
from .model.conversion import to_hf_vit_state_dict
from .model.loading_report import LoadingReport
from .model.modeling_vit_ft import ViTFTForImageClassification, ViTFTModel, ViTFTPreTrainedModel
from .model.pos_embed import resample_position_embeddings
from .model.sizes import VIT_SIZES

__version__ = "0.1.0"

AutoConfig.register("vit_ft", ViTFTConfig, exist_ok=True)
AutoModel.register(ViTFTConfig, ViTFTModel, exist_ok=True)
AutoModelForImageClassification.register(ViTFTConfig, ViTFTForImageClassification, exist_ok=True)
# save_pretrained copies the model code and writes auto_map, so folders load with trust_remote_code=True
ViTFTConfig.register_for_auto_class()
ViTFTModel.register_for_auto_class("AutoModel")
ViTFTForImageClassification.register_for_auto_class("AutoModelForImageClassification")

__all__ = [
    "VIT_SIZES",
    "LoadingReport",
    "ViTFTConfig",
    "ViTFTForImageClassification",
    "ViTFTModel",
    "ViTFTPreTrainedModel",
    "resample_position_embeddings",
    "to_hf_vit_state_dict",
]
