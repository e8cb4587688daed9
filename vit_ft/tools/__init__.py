"""The tools that use a trained model: `trained` (the one reader of a trained folder, Hub id or checkpoint),
`inference` (the batched loop and the bf16 setting), `prediction`, `evaluation` (with `eval_data`),
`inspection` (with `rollout`), `fewshot/`, `hub` (staging and pushing), and `arguments` (the flags they share).
What they draw and write for people to read is in `vit_ft.reports`; their commands are in `vit_ft.commands`."""
