"""Helpers every layer shares, each concept once: atomic writes (`files`), the output-folder guard
(`output_dir`), the Hub-id check (`hub_ids`), logging (`logs`), the run record (`run_record`), the tools'
error handling (`cli`), process groups (`distributed`) and hardware policy (`hardware`). The lowest layer:
imports nothing else of vit_ft (pyproject's import-linter contracts)."""
