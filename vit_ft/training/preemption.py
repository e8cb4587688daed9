"""Preemption: SIGTERM (what Slurm, Kubernetes and spot instances send before they kill) and SIGUSR1 (Slurm's
`--signal=USR1@<seconds>`) make the fine-tune save a checkpoint at the next step boundary and stop, instead of
dying with the last checkpoint maybe an epoch old. The command then prints where the checkpoint is and exits
with `PREEMPTED_EXIT` (75, EX_TEMPFAIL: "try again later"), so that a job script can requeue the run with
`--resume`; the run record stays unfinished.

Under `accelerate launch` the signal reaches every process, not at the same instant: the processes agree on
the step to stop at (the flag is all-reduced at each step end), so that they save one checkpoint together.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

PREEMPTED_EXIT = 75  # EX_TEMPFAIL (sysexits.h): a temporary failure, run the same command with --resume
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preempted(Exception):
    """The fine-tune stopped on a signal after saving `checkpoint`; run the same command with --resume."""

    def __init__(self, signal_name: str, checkpoint: Path) -> None:
        self.signal_name = signal_name
        self.checkpoint = checkpoint
        super().__init__(
            f"stopped by {signal_name}; the run is saved in {checkpoint}. Run the same command with "
            "--resume to continue."
        )


def _any_process(flag: bool, args: Any) -> bool:
    """Whether any process has `flag` set (several-process runs agree on the step to stop at)."""
    import torch
    import torch.distributed as dist

    if args.world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=args.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


class PreemptionCallback(TrainerCallback):
    """Catches SIGTERM / SIGUSR1 while the Trainer trains; at the next step end, asks it to save and stop.

    The handlers are installed at the start of training and the previous ones put back at its end: a signal
    before or after training (loading data, the final save) keeps its usual effect.
    """

    def __init__(self) -> None:
        self.received: str | None = None  # the signal's name, once one arrives
        self.stopped_at: int | None = None  # the step whose checkpoint was saved on it
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = signal.Signals(signum).name

    def on_train_begin(self, args, state, control, **kwargs):
        self.received, self.stopped_at = None, None
        self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}

    def on_step_end(self, args, state, control, **kwargs):
        if _any_process(self.received is not None, args):
            self.received = self.received or "SIGTERM"  # another process got it
            self.stopped_at = state.global_step
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self.restore()

    def restore(self) -> None:
        """Put back the handlers training replaced (also when training raised: on_train_end never came)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def check(self, output_dir: str | Path) -> None:
        """Raise Preempted when training stopped on a signal (its checkpoint is saved)."""
        if self.stopped_at is not None:
            raise Preempted(self.received or "a signal", Path(output_dir) / f"checkpoint-{self.stopped_at}")


__all__ = ["PREEMPTED_EXIT", "Preempted", "PreemptionCallback"]
