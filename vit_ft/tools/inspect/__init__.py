"""vit-ft inspect: Figure 7 and attention distances (`run`), attention rollout (`rollout`, also the demo's)."""
