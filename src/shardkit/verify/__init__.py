"""The planner checked against the compiler: compile real training steps and compare.

The planner (`shardkit.plan`) is pure arithmetic; this package is where its predictions meet
XLA. `measure` / `measure_gpt` compile a step (on a simulated mesh, or an `AbstractMesh` of
thousands of devices) and read memory, collectives and FLOPs per device; `verify(plan)`
compiles a plan's top layouts with shardkit's GPT and prints predicted next to compiled. It
sits above the planner, the Trainer and the inspection, and may import all three.

Example:
    >>> import shardkit.plan as sp
    >>> from shardkit.verify import verify
    >>> p = sp.plan("gpt3-175b", devices=1024, hardware="h100", batch=1536)
    >>> result = verify(p, top=1)      # prints predicted vs compiled per quantity
"""

from shardkit.verify.compare import BOUNDS as BOUNDS
from shardkit.verify.compare import Check as Check
from shardkit.verify.compare import Row as Row
from shardkit.verify.compare import Verification as Verification
from shardkit.verify.compare import verify as verify
from shardkit.verify.measurement import Measurement as Measurement
from shardkit.verify.measurement import measure as measure
from shardkit.verify.measurement import measure_gpt as measure_gpt

__all__ = [
    "BOUNDS",
    "Check",
    "Measurement",
    "Row",
    "Verification",
    "measure",
    "measure_gpt",
    "verify",
]
