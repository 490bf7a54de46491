"""Test configuration: 8 simulated CPU devices, set before JAX starts."""

import os

# Must happen before the JAX backend starts: later changes are refused by JAX.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import jax  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import AxisType  # noqa: E402

jax.config.update("jax_threefry_partitionable", True)

AXIS_TYPES = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}


@pytest.fixture(params=["auto", "explicit"])
def axis_type(request):
    """Parametrises a test over Auto and Explicit mesh axes."""
    return AXIS_TYPES[request.param]


def pytest_report_header(config):
    return f"jax {jax.__version__}, {jax.device_count()} devices ({jax.default_backend()})"
