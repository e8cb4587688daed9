"""Fine-tuning: the arguments and recipes (`arguments`, `recipe_fields`, `recipes`, `argument_checks`), the one
reader of a fine-tune's command line (`argv`), the Trainer stages (`stages`, `callbacks`), the output folder between
runs (`checkpoints`), LoRA, the digits pre-training, the sweep (`sweep`, `sweep_results`) and the seeds loop."""
