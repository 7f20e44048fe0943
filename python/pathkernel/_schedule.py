"""When a recording stores a checkpoint (the weights and the optimizer's
state); the steps between are replayed by the engine.

A Python loop is seen one step at a time, so the recorder cannot know the
number of steps N that the usual √N spacing needs. Three schedules:

* ``every_step``: a checkpoint after every step (the uncompressed format);
* ``expected_steps=E`` given: every ⌈√E⌉ steps, the spacing that balances
  the checkpoints' bytes against the steps a replay covers when N ≈ E;
* neither (the default): a √-growing spacing, the next checkpoint after c at
  c + ⌈√c⌉ (1, 2, 4, 6, 9, 12, 16, 20, 25, ...). After N steps there are
  about 2√N checkpoints and no segment is longer than about √N + 1 steps,
  so storage and the longest replay stay within a factor 2 of the √N
  optimum for every N, without knowing N.

The last step of a recording is always a checkpoint (written at close).
"""
import math
from dataclasses import dataclass
from typing import Optional

from ._errors import RecorderError


@dataclass(frozen=True)
class CheckpointSchedule:
    """Which steps get a checkpoint: every step, every ``interval`` steps, or
    (interval 0) the √-growing spacing."""
    interval: int

    @classmethod
    def choose(cls, every_step: bool, expected_steps: Optional[int]) -> "CheckpointSchedule":
        if every_step:
            return cls(1)
        if expected_steps is None:
            return cls(0)
        if isinstance(expected_steps, bool) or not isinstance(expected_steps, int) or expected_steps < 1:
            raise RecorderError(f"expected_steps is {expected_steps!r}, expected an integer >= 1 (the number of "
                                f"steps the loop will take, roughly) or None")
        return cls(max(1, math.isqrt(expected_steps - 1) + 1))

    @property
    def every_step(self) -> bool:
        return self.interval == 1

    def next_after(self, step: int) -> int:
        """The first checkpoint step after checkpoint ``step``."""
        if self.interval > 0:
            return step + self.interval
        return step + max(1, math.isqrt(max(step - 1, 0)) + 1) if step > 0 else 1

    def describe(self) -> str:
        if self.interval == 1:
            return "every step"
        if self.interval > 1:
            return f"every {self.interval} steps"
        return "√-growing spacing (after c, at c + ⌈√c⌉)"
