"""Class-specific explanation maps (gradient-weighted rollout, Grad-CAM, captum's integrated gradients and
occlusion, beside the class-agnostic rollout) and how faithful they are (deletion / insertion AUC, the
randomisation check)."""
