"""Fine-tuning: the arguments in three rooms (the recipe `recipes`; the dataclasses `arguments`,
`training_arguments`, `augmentation_arguments`; the checks `argument_checks`), the Trainer stages (`stages`,
`callbacks`), the output folder between runs (`checkpoints`), LoRA, the digits pre-training, the sweep (`sweep`,
`sweep_results`) and the seeds loop. The fine-tune's own switches are read by `vit_ft.commands.finetune`."""
