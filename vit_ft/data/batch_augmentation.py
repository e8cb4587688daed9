"""Per-batch augmentation on the training device, each image its own draws: flip, RandAugment / TrivialAugment
/ colour jitter, normalisation, random erasing, then mixup / CutMix.

    transform = build_transforms(384, mean, std, train=True, seed=42, augmentation=spec, device_augmentation=True)
    augment = BatchAugmentation(transform, mixer)        # mixer: a MixupCutmix or None
    trainer = FineTuneTrainer(..., batch_augmentation=augment)  # its collate for train batches, the call on
                                                         # each train batch once on the device (never eval)

The DataLoader workers only decode and crop (`device_augmentation=True`: uint8 crops, a quarter of float32's
bytes); the rest runs here on whole batches, on whatever device the batch is on. The ops are those of
`vit_ft.data.augmentation` (kornia's, set to timm's semantics), applied per image as timm applies them: kornia's
batched RandAugment draws one op sequence for the whole batch (`rand_selector` once per call), so the draws
are made here per image and each op runs once on the images that drew it, with their own magnitudes and signs
(kornia's own parameters, its magnitude passed in). Colour jitter draws its factors and its order per image;
random erasing its box (kornia's generator) and its fill per image.

Randomness: image i's draws come from a generator seeded by `augmentation_seed(seed, epoch, index_i, "batch")`
(the erasing's fill from one seeded by the "erase" stream, on the batch's device), never from the global RNG:
a resumed run augments each image exactly as an uninterrupted one, whatever its batch-mates, the workers or the
process, and dropout's RNG is left alone. The batch must carry `INDEX_COLUMN` (`collate` keeps it). Mixup /
CutMix keep their batch-level draw (`vit_ft.data.mixup`, seeded by the batch's indices), as timm's "batch" mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .collate import collate_fn
from .transforms import INDEX_COLUMN, ImageClassificationTransform, augmentation_seed

if TYPE_CHECKING:  # kornia (behind the augmentation) loads only when a spec asks for it
    from .augmentation import ImageAugmentation
    from .mixup import MixupCutmix

__all__ = ["BatchAugmentation"]

_JITTER_STEPS = ("brightness_factor", "contrast_factor", "saturation_factor", "hue_factor")


class BatchAugmentation:
    """The train transform's flip, augmentation and normalisation (and `mixup`), per batch of uint8 crops.

    Args:
        transform: the train transform built with `device_augmentation=True` (its settings: mean, std,
            rescale factor, flip, augmentation spec, seed).
        mixup: the batch mix after the per-image work, or None.
    """

    def __init__(self, transform: ImageClassificationTransform, mixup: MixupCutmix | None = None) -> None:
        if not transform.crops_only:
            raise ValueError(
                "BatchAugmentation needs the train transform that returns uint8 crops: "
                "build_transforms(train=True, device_augmentation=True)."
            )
        self.transform, self.mixup = transform, mixup
        self.seed = transform.seed
        spec = transform.augmentation
        self.ops: ImageAugmentation | None = spec.build() if spec is not None else None
        self.epoch = 0
        self._layout = self._draw_layout()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()!r}, seed={self.seed})"

    def describe(self) -> str:
        """What runs per batch on the device, in a few words."""
        parts = ["flip"] if self.transform.horizontal_flip else []
        parts += [self.ops.spec.describe()] if self.ops is not None else []
        parts += [self.mixup.describe()] if self.mixup is not None else []
        return " + ".join(["normalise", *parts]) if parts else "normalise"

    def set_epoch(self, epoch: int) -> None:
        """Draw the augmentations (and the mixes) of `epoch` from now on."""
        self.epoch = int(epoch)
        if self.mixup is not None:
            self.mixup.set_epoch(epoch)

    def collate(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """`collate_fn` keeping the examples' `INDEX_COLUMN` (the per-image draws' key) as a (batch,) tensor."""
        batch = collate_fn(examples)
        if INDEX_COLUMN in examples[0]:
            batch[INDEX_COLUMN] = torch.tensor([int(example[INDEX_COLUMN]) for example in examples])
        return batch

    # -----------------------------------------------------------------------------------------------------
    # draws
    # -----------------------------------------------------------------------------------------------------

    def _draw_layout(self) -> dict[str, slice]:
        """Where each draw sits among an image's uniforms (one `torch.rand` call per image)."""
        sizes = {"flip": 1}
        auto_augment = self.ops.spec.auto_augment if self.ops is not None else None
        if auto_augment == "randaugment":
            steps = self.ops.pixel_ops.n
            sizes |= {"op": steps, "apply": steps, "sign": steps}
        elif auto_augment == "trivialaugment":  # one op per image
            sizes |= {"op": 1, "magnitude": 1, "sign": 1}
        elif self.ops is not None and self.ops.pixel_ops is not None:  # colour jitter
            sizes |= {"jitter": 3, "order": len(_JITTER_STEPS)}
        sizes |= {"erase": 1} if self.ops is not None and self.ops.erasing is not None else {}
        layout, start = {}, 0
        for name, size in sizes.items():
            layout[name] = slice(start, start + size)
            start += size
        return layout

    def draws(self, indices: torch.Tensor | None, count: int) -> torch.Tensor:
        """(count, draws) uniforms in [0, 1): row i from image i's own generator, seeded by (seed, epoch,
        index, "batch"); without indices or seed, from seeds drawn from torch's global RNG."""
        width = max(piece.stop for piece in self._layout.values())
        seeds = self._seeds(indices, count, "batch")
        rows = [torch.rand(width, generator=torch.Generator().manual_seed(seed)) for seed in seeds]
        return torch.stack(rows)  # (count, width)

    def _seeds(self, indices: torch.Tensor | None, count: int, stream: str) -> list[int]:
        if indices is None or self.seed is None:
            return torch.randint(2**31, (count,)).tolist()
        return [augmentation_seed(self.seed, self.epoch, int(i), stream) for i in indices.tolist()]

    # -----------------------------------------------------------------------------------------------------
    # the batch
    # -----------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """{"pixel_values": (batch, channels, height, width) uint8, "labels": ..., INDEX_COLUMN: (batch,)} ->
        the same with float32 pixel_values augmented and normalised, labels mixed (soft) with `mixup`, and the
        index column dropped (the model takes no such input)."""
        batch = dict(batch)
        indices = batch.pop(INDEX_COLUMN, None)
        pixels = batch["pixel_values"]
        if pixels.dtype != torch.uint8 or pixels.dim() != 4:
            raise ValueError(
                f"BatchAugmentation takes uint8 (batch, channels, height, width) crops, got {pixels.dtype} "
                f"{tuple(pixels.shape)}: build the train transform with device_augmentation=True."
            )
        draws = self.draws(indices, len(pixels))
        layout = self._layout
        if self.transform.horizontal_flip:
            flip = (draws[:, layout["flip"]] < 0.5).view(-1, 1, 1, 1).to(pixels.device)
            pixels = torch.where(flip, pixels.flip(-1), pixels)
        x = pixels.to(torch.float32).mul_(self.transform.rescale_factor)  # [0, 1], as the worker path
        if self.ops is not None and self.ops.pixel_ops is not None:
            x = self._pixel_ops(x, draws).clamp_(0.0, 1.0)
        mean = torch.tensor(self.transform.mean, device=x.device).view(-1, 1, 1)
        std = torch.tensor(self.transform.std, device=x.device).view(-1, 1, 1)
        x = x.sub_(mean).div_(std)
        if "erase" in layout:
            x = self._erase(x, draws[:, layout["erase"]].squeeze(1), indices)
        batch["pixel_values"] = x
        if self.mixup is not None and "labels" in batch:
            batch[INDEX_COLUMN] = indices
            batch = self.mixup(batch)
        return batch

    def _pixel_ops(self, x: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
        """RandAugment / TrivialAugment / colour jitter on [0, 1] images, each image its drawn ops."""
        pixel_ops = self.ops.pixel_ops
        if "jitter" in self._layout:
            return self._jitter(x, draws)
        ops = [module[0] for module in pixel_ops.children()]  # each PolicySequential holds one op
        layout = self._layout
        chosen = (draws[:, layout["op"]] * len(ops)).long().clamp_(max=len(ops) - 1)  # (batch, steps)
        signs = torch.where(draws[:, layout["sign"]] < 0.5, 1.0, -1.0)
        # RandAugment: each drawn op applies with its probability, at the fixed magnitude
        if "apply" in layout:
            applied = draws[:, layout["apply"]] < ops[0].op.p
            level = torch.full_like(signs, pixel_ops.m / 30)
        else:  # TrivialAugment: always applied, at a uniform magnitude
            applied = torch.ones_like(chosen, dtype=torch.bool)
            level = draws[:, layout["magnitude"]]
        for step in range(chosen.shape[1]):
            for op_index in chosen[:, step][applied[:, step]].unique().tolist():
                rows = torch.nonzero(applied[:, step] & (chosen[:, step] == op_index)).squeeze(1)
                op = ops[op_index]
                value = _op_value(op, level[rows, step], signs[rows, step], x.shape, "apply" in layout)
                x[rows.to(x.device)] = _apply(op.op, x[rows.to(x.device)], op._factor_name, value)
        return x

    def _jitter(self, x: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
        """Colour jitter with each image's factors and order (torchvision's ColorJitter, per image)."""
        jitter = self.ops.pixel_ops
        strength = self.ops.spec.color_jitter
        factors = 1.0 - strength + 2.0 * strength * draws[:, self._layout["jitter"]]  # (batch, 3) in 1 +- c
        orders = torch.argsort(draws[:, self._layout["order"]], dim=1)  # (batch, 4) a permutation each
        for order in orders.unique(dim=0):
            rows = torch.nonzero((orders == order).all(dim=1)).squeeze(1)
            values = {name: factors[rows, i] for i, name in enumerate(_JITTER_STEPS[:3])}
            values |= {"hue_factor": torch.zeros(len(rows)), "order": order}
            x[rows.to(x.device)] = _apply(jitter, x[rows.to(x.device)], None, None, values)
        return x

    def _erase(self, x: torch.Tensor, draws: torch.Tensor, indices: torch.Tensor | None) -> torch.Tensor:
        """Random erasing: each image erased with its probability, in its own box (kornia's generator, seeded
        per image), filled as the mode says (a per-image seeded normal fill on the batch's device)."""
        from .augmentation import erase_boxes

        erasing = self.ops.erasing
        rows = torch.nonzero(draws < erasing.p).squeeze(1)
        if len(rows) == 0:
            return x
        seeds = self._seeds(indices, len(draws), "erase")
        one = torch.Size([1, *x.shape[1:]])
        boxes, fills = [], []
        for row in rows.tolist():
            with torch.random.fork_rng(devices=[]):
                torch.random.default_generator.manual_seed(seeds[row])  # the CPU one only: CUDA untouched
                boxes.append(erasing._param_generator(one, same_on_batch=False))
            if erasing.mode != "const":
                generator = torch.Generator(device=x.device).manual_seed(seeds[row])
                fills.append(torch.randn(erasing.fill_shape(one), generator=generator, device=x.device))
        params = {key: torch.cat([box[key] for box in boxes]) for key in ("xs", "ys", "widths", "heights")}
        fill = torch.cat(fills) if fills else torch.zeros((), device=x.device)
        rows = rows.to(x.device)
        x[rows] = erase_boxes(x[rows], params, fill)
        return x


def _op_value(
    op: Any, level: torch.Tensor, sign: torch.Tensor, shape: torch.Size, rand_augment: bool
) -> torch.Tensor | None:
    """An auto-augment op's parameter for images at `level` (0..1 of its magnitude range) with `sign`, as
    kornia's RandAugment (posterize's bits backwards) / TrivialAugment (uniform) compute it: the range's point,
    translations in pixels, then the op's magnitude mapping and, for a symmetric op, the sign."""
    if op.magnitude_range is None:
        return None
    low, high = (float(v) for v in op.magnitude_range)
    fraction = 1 - level if op._factor_name == "bits_factor" and rand_augment else level
    magnitude = fraction * (high - low) + low
    if op._factor_name == "bits_factor" and not rand_augment:
        # rounded as kornia's posterize generator rounds its draw from TrivialAugment's fractional range, under
        # every version (augmentation's `_POSTERIZE_TOP`); RandAugment's level is not
        magnitude = magnitude.round()
    if op._factor_name == "translate_x":
        magnitude = magnitude * shape[-1]
    elif op._factor_name == "translate_y":
        magnitude = magnitude * shape[-2]
    mapping = op._magnitude_fn
    if hasattr(mapping, "fn"):  # kornia's _RandomSign around the mapping: the sign is ours
        return mapping.fn(magnitude) * sign
    return mapping(magnitude)


def _apply(
    augmentation: Any,
    x: torch.Tensor,
    factor: str | None,
    value: torch.Tensor | None,
    values: dict[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Run a kornia augmentation on every image of `x` with the given parameter values: its own parameters for
    this shape (drawn under a fixed seed, outside the global RNG), the drawn ones put in, all applied."""
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(0)  # the CPU one only (torch.manual_seed: CUDA too)
        params = augmentation.forward_parameters(x.shape)
    if factor is not None:
        params[factor] = value
    params.update(values or {})
    params["batch_prob"] = torch.ones(len(x))
    return augmentation(x, params={key: value.to(x.device) for key, value in params.items()})
