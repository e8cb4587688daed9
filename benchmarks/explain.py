"""How faithful the explanation maps are, and how long each takes (issue 49).

    python -m benchmarks.explain --task marked                 # the generated task (a tiny ViT trained here)
    python -m benchmarks.explain --model outputs/digits --count 64 --seed 0   # a trained folder: a seeded sample of its evaluation images
    python -m benchmarks.explain --timing                      # ViT-B/16 at 224 px (random weights): s per map

Per method: deletion and insertion AUC (patches in the map's order, most relevant first, each replaced by the
image's per-channel mean: mean-filled, not blurred; `STEPS` + 1 points), the same for a random order (the
floor), the randomisation check (Spearman correlation of each map before and after re-initialising the top
block and the head; low means the map depends on the learned weights), and on the generated task the share of
images whose marked patch ranks in the top 5 % and the correlation of an image's maps for its two classes.
The cascading randomisation (Adebayo et al. 2018) re-initialises the head, then one block more at a time from the
top down to the first, and gives each method's correlation after every step (its own table). The timing compares
one map with one forward + backward pass of the same model on the same image.

The generated task: noise images with none, one or two marked patches of distinct colours; each colour is one label
of a multi-label task, so a class is on exactly when its marker is there and its evidence is that patch.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from typing import Any

import torch

SIZE, PATCH, CLASSES = 32, 4, 3
GRID = SIZE // PATCH
TOP = 0.05  # the "top 5 %" of the patches


def marked_images(count: int, seed: int, markers: int | None = None):
    """`(count, 3, SIZE, SIZE)` noise with 0, 1 or 2 (or `markers`) marked patches of distinct colours (channel c
    high, the others low: class c), their multi-hot labels `(count, CLASSES)` and the marked patches' indices
    `(count, CLASSES)` (-1 where a class is absent). Images without a marker (no label) are in the training
    data so that an image whose markers are deleted is one the model knows, not one it never saw."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(count, 3, SIZE, SIZE, generator=generator) * 0.5
    labels = torch.zeros(count, CLASSES)
    where = torch.full((count, CLASSES), -1)
    for i in range(count):
        number = markers if markers is not None else int(torch.randint(0, 3, (1,), generator=generator))
        classes = torch.randperm(CLASSES, generator=generator)[:number]
        cells = torch.randperm(GRID * GRID, generator=generator)[:number]
        for c, cell in zip(classes.tolist(), cells.tolist(), strict=True):
            row, col = divmod(cell, GRID)
            marker = torch.full((3, PATCH, PATCH), -1.5)
            marker[c] = 2.0
            images[i, :, row * PATCH : (row + 1) * PATCH, col * PATCH : (col + 1) * PATCH] = marker
            labels[i, c], where[i, c] = 1.0, cell
    return images, labels, where


def train_marked_model(steps: int = 300, hidden: int = 64, seed: int = 0) -> torch.nn.Module:
    """A tiny multi-label ViT (2 blocks, `hidden` wide, 32 px, patch 4) trained on `marked_images` with AdamW
    (every label right on 24 held-out two-marker images after 300 steps)."""
    from vit_ft import ViTFTConfig, ViTFTForImageClassification

    torch.manual_seed(seed)
    config = ViTFTConfig(
        hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        image_size=SIZE, patch_size=PATCH, num_labels=CLASSES, problem_type="multi_label_classification",
    )  # fmt: skip
    model = ViTFTForImageClassification(config)
    torch.nn.init.normal_(
        model.classifier.weight, std=0.02
    )  # a zero head gives the blocks no gradient at first
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    for step in range(steps):
        images, labels, _ = marked_images(64, seed=1000 + step)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(pixel_values=images).logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def two_targets(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The first and second present class of each image with two markers."""
    present = [torch.nonzero(row).flatten() for row in labels]
    return torch.stack([p[0] for p in present]), torch.stack([p[1] for p in present])


def pearson(maps: torch.Tensor, others: torch.Tensor) -> torch.Tensor:
    """Pearson correlation of each pair of maps `(batch,)`; a constant map correlates with nothing (0)."""
    return torch.stack(
        [
            torch.nan_to_num(torch.corrcoef(torch.stack([a, b]))[0, 1])
            for a, b in zip(maps, others, strict=True)
        ]
    )


def method_row(model, images, target, method: str, seed: int = 0) -> dict[str, Any]:
    """One method's faithfulness figures on `images` for `target` (means over the images) and its seconds per image."""
    from vit_ft.tools.explain.faithfulness import perturbation_auc, randomized_copy, spearman
    from vit_ft.tools.explain.methods import explain

    start = time.perf_counter()
    maps = explain(model, images, method, target=target)
    seconds = (time.perf_counter() - start) / len(images)
    randomized = explain(randomized_copy(model, top_blocks=1, seed=seed), images, method, target=target)
    return {
        "method": method,
        "deletion_auc": round(float(perturbation_auc(model, images, maps, target, "deletion").mean()), 4),
        "insertion_auc": round(float(perturbation_auc(model, images, maps, target, "insertion").mean()), 4),
        "randomisation_spearman": round(float(spearman(maps, randomized).mean()), 3),
        "seconds_per_image": round(seconds, 4),
        "_maps": maps,
    }


def cascade_rows(model, images, target, seed: int = 0) -> list[dict[str, Any]]:
    """Per method, the cascading randomisation (Adebayo et al. 2018: the head, then the blocks from the top down,
    `faithfulness.cascading_randomization`): the mean Spearman correlation with the trained model's map after each
    step, one column per step."""
    from vit_ft.tools.explain.faithfulness import cascading_randomization
    from vit_ft.tools.explain.methods import METHODS

    rows = []
    for method in METHODS:
        steps = cascading_randomization(model, images, method, target, seed=seed)
        rows.append({"method": method, **{step["randomised"]: round(step["spearman"], 3) for step in steps}})
    return rows


def random_row(model, images, target, seed: int = 0) -> dict[str, Any]:
    from vit_ft.tools.explain.faithfulness import perturbation_auc, random_maps

    maps = random_maps(torch.zeros(len(images), _patches(model, images)), seed)
    return {
        "method": "random order",
        "deletion_auc": round(float(perturbation_auc(model, images, maps, target, "deletion").mean()), 4),
        "insertion_auc": round(float(perturbation_auc(model, images, maps, target, "insertion").mean()), 4),
    }


def _patches(model, images) -> int:
    patch_h, patch_w = model.config.patch_hw
    return (images.shape[-2] // patch_h) * (images.shape[-1] // patch_w)


def marked_task(count: int = 24, steps: int = 300) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every method's row on the generated task (images with two markers), and the random order's; the cascade's."""
    from vit_ft.tools.explain.methods import METHODS, explain

    model = train_marked_model(steps)
    images, labels, where = marked_images(count, seed=1, markers=2)
    first, second = two_targets(labels)
    cells = where.gather(1, first[:, None])[:, 0]
    rows = []
    for method in METHODS:
        row = method_row(model, images, first, method)
        maps = row.pop("_maps")
        above = (maps > maps.gather(1, cells[:, None])).sum(dim=1)  # patches ranked above the marked one
        row["marked_patch_in_top_5pct"] = round(float((above < TOP * GRID * GRID).float().mean()), 3)
        other = explain(model, images, method, target=second)
        row["two_class_correlation"] = round(float(pearson(maps, other).mean()), 3)
        rows.append(row)
    return [*rows, random_row(model, images, first)], cascade_rows(model, images, first)


def trained_folder(model: str, count: int = 64, seed: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every method's row on `count` evaluation images of a trained folder (a seeded sample), for the predicted
    class, and the cascade's."""
    from vit_ft.tools.evaluate.data import resolve_eval_data
    from vit_ft.tools.explain.methods import METHODS
    from vit_ft.tools.trained import load_trained

    trained = load_trained(model, device="cpu")
    data = resolve_eval_data(trained.origin, trained.id2label, max_samples=count, seed=seed)
    images = torch.stack([trained.transform.transform_image(image) for image in data.dataset["image"]])
    with torch.no_grad():
        target = trained.model(pixel_values=images).logits.argmax(-1)
    rows = []
    for method in METHODS:
        row = method_row(trained.model, images, target, method)
        row.pop("_maps")
        rows.append(row)
    return [*rows, random_row(trained.model, images, target)], cascade_rows(trained.model, images, target)


def timing(image_size: int = 224, rounds: int = 5) -> list[dict[str, Any]]:
    """Seconds for one map of one image on a ViT-B/16 (random weights) against one forward + backward, medians
    over `rounds` interleaved rounds (`vit_ft.utils.timing.interleave`) after one warm-up call each."""
    from vit_ft import ViTFTConfig, ViTFTForImageClassification
    from vit_ft.tools.explain.methods import METHODS, explain
    from vit_ft.utils.timing import interleave

    config = ViTFTConfig(image_size=image_size, patch_size=16, num_labels=1000)  # ViT-B/16's sizes by default
    model = ViTFTForImageClassification(config).eval()
    torch.nn.init.normal_(model.classifier.weight, std=0.02)
    image = torch.randn(1, 3, image_size, image_size, generator=torch.Generator().manual_seed(0))

    def forward_backward():
        model.zero_grad(set_to_none=True)
        model(pixel_values=image).logits[0, 0].backward()

    calls = {"forward+backward": forward_backward}
    calls.update({method: (lambda m=method: explain(model, image, m, target=0)) for method in METHODS})
    times = interleave(calls, warmup=1, rounds=rounds)
    reference = statistics.median(times["forward+backward"])
    return [{"method": name, "seconds": round(statistics.median(values), 4),
             "ratio_to_forward_backward": round(statistics.median(values) / reference, 2)}
            for name, values in times.items()]  # fmt: skip


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (columns in first-seen order; a missing figure is a dash)."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c, "-")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=("marked",), help="the generated task")
    parser.add_argument("--model", help="a trained folder (its evaluation images)")
    parser.add_argument(
        "--timing", action="store_true", help="ViT-B/16 time per map against forward + backward"
    )
    parser.add_argument("--count", type=int, default=24, help="images")
    parser.add_argument("--steps", type=int, default=300, help="training steps of the generated task's model")
    parser.add_argument("--seed", type=int, default=0, help="the seed of --model's sample of evaluation images")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    sections = []
    if args.task:
        rows, cascade = marked_task(args.count, args.steps)
        sections += [("generated task (marked patches)", rows), ("generated task: cascading randomisation", cascade)]
    if args.model:
        rows, cascade = trained_folder(args.model, args.count, args.seed)
        sections += [(args.model, rows), (f"{args.model}: cascading randomisation", cascade)]
    if args.timing:
        sections.append(("ViT-B/16 at 224 px, one image", timing()))
    for name, rows in sections:
        print(f"\n## {name}\n\n{markdown(rows)}")
        for row in rows:
            print(json.dumps({"section": name, **row}))


if __name__ == "__main__":
    main()
