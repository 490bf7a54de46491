"""Deprecated: moved to `shardkit.verify.measurement` (the planner stays pure; compiling the
real step to check it lives in `shardkit.verify`). This alias goes in the next release."""

import sys
import warnings

from shardkit.verify import measurement as _moved

warnings.warn(
    "shardkit.plan.measure moved to shardkit.verify.measurement (import from shardkit.verify); "
    "the old path goes in the next release.",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
