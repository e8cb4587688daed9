"""Process-group helpers for runs under `accelerate launch` (several processes): each is a no-op in a single
process, so the same code runs either way."""

from __future__ import annotations

from typing import Any


def broadcast_object(value: Any) -> Any:
    """`value` from process 0 on every process (several-process runs); `value` itself in a single process."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_to_zero(value: Any) -> list[Any] | None:
    """Every process's `value`, in process order, on process 0 and None on the others (several-process runs);
    `[value]` in a single process. Every process must call it."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(value, gathered, dst=0)
    return gathered


def end_process_group() -> None:
    """Destroy the several-process group, if any, before the process exits, every process together: a gloo group
    left to interpreter shutdown, or destroyed by one process while process 0 still writes the run's last files
    (the feature bank, the report), can abort it ("terminate called without an active exception")."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


__all__ = ["broadcast_object", "end_process_group", "gather_to_zero"]
