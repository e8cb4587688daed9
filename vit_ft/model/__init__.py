"""vit_ft.model: the configuration, named sizes, modeling and position embeddings (what a saved folder carries),
and the loading code around them: checkpoint formats (transformers ViT, timm, JAX), the weight conversion, the
loading report, the normalisation a checkpoint states, and the export.

Importing the package installs the loading hooks (`loading.py`) on the model and config classes.
"""

from . import loading  # noqa: F401
