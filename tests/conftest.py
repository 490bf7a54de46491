"""Test configuration: 8 simulated CPU devices and a shared compilation cache, set before JAX
starts."""

import os
import shutil
import tempfile

# Must happen before the JAX backend starts: later changes are refused by JAX.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# LLVM's -O0 for the CPU code: the suite's programs are small and compiled once, so compiling
# them dominates the suite (a GPT's initializer: 6.3 s at the default level, 1.5 s here); the
# HLO, its collectives and its buffers are the same. Subprocesses inherit it unless a test
# sets its own XLA_FLAGS.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
).strip()

# One persistent compilation cache per test run, shared by the xdist workers and every
# subprocess they start (the environment is inherited; the controller sets it before it starts
# the workers): a program that several tests compile -- a `shardkit train` relaunched after a
# fault, the same solve at the same shape -- is compiled once. A size cap turns on JAX's file
# lock, so two workers never read an entry while the other is writing it. Removed at the end.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="shardkit-tests-jax-cache-")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(8 << 30))

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


def pytest_unconfigure(config):
    if _OWN_CACHE and not hasattr(config, "workerinput"):  # the process that made it
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
