"""Deprecated: moved to `shardkit.verify.compare` (the planner stays pure; compiling the real
step to check it lives in `shardkit.verify`). This alias goes in the next release."""

import sys
import warnings

from shardkit.verify import compare as _moved

warnings.warn(
    "shardkit.plan.verify moved to shardkit.verify.compare (import from shardkit.verify); the "
    "old path goes in the next release.",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
