"""What people read: figures (`figures`, `inspection_figures`), an evaluation's report, the training curves and
the model card (`reporting`), the few-shot report (`fewshot`), and the example images (`examples`). Reports
draw what the tools computed; they import no tool."""
