"""Test configuration: 8 simulated CPU devices, set before JAX starts."""

import os

# Must happen before the JAX backend starts: later changes are refused by JAX.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# LLVM's -O0 for the CPU code: the suite's programs are small and compiled once, so compiling
# them dominates the suite (a GPT's initializer: 6.3 s at the default level, 1.5 s here); the
# HLO, its collectives and its buffers are the same; numbers may differ from -O2's in the last
# bits (another FMA contraction), so a test that compares bit for bit with a subprocess passes
# these flags on. Subprocesses inherit them unless a test sets its own XLA_FLAGS.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
).strip()

# Idle OpenBLAS workers (LAPACK under jnp.linalg) sleep at once instead of spinning 2^28 cycles
# on the cores the 8 simulated devices share, as `shardkit.simulate_cpu_devices` arranges:
# tests/test_linalg_lu.py took 93 s with it against 112 s without.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import gc  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import AxisType  # noqa: E402

jax.config.update("jax_threefry_partitionable", True)

AXIS_TYPES = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}


@pytest.fixture(params=["auto", "explicit"])
def axis_type(request):
    """Parametrises a test over Auto and Explicit mesh axes."""
    return AXIS_TYPES[request.param]


# Whole programs run as users run them (the CLI, the examples, the docs' pages, killed and
# multi-process runs): marked `slow`. The newest pins run them; the oldest-pins half of `make
# test` leaves them out (-m "not slow"), as the library code they drive is tested in-process
# on both, and running everything twice would take `make test` past its time.
WHOLE_PROGRAM_FILES = {
    "test_checkpoint_kill.py", "test_cli.py", "test_docs.py", "test_examples_docstring.py",
    "test_examples_pipeline.py", "test_examples_seeds.py", "test_examples_train.py",
    "test_examples_your_model.py", "test_multihost.py", "test_multihost_faults.py",
    "test_readme.py", "test_report_browser.py", "test_train_cli.py", "test_train_faults.py",
}  # fmt: skip


# A parametrized test's further parameter sets (sizes, dtypes, layouts, meshes): marked `sweep`.
# The first set of each test function, once per mesh axis type, is not: the oldest-pins half of
# `make test` runs that one (-m "not slow and not sweep") and so checks every behaviour, on Auto
# and Explicit axes, against the oldest releases, while the newest pins run every set (the
# numerics a sweep varies are the same code on both; running both in full took `make test`
# about twice its time). `make test-oldest OLDEST_MARKS=` runs everything there.


def _axis_types_of(item) -> tuple:
    """The mesh axis types among a parametrized item's parameters (a fixture or a value)."""
    params = item.callspec.params
    return tuple(
        str(v) for name, v in sorted(params.items())
        if name == "axis_type" or isinstance(v, AxisType)
    )  # fmt: skip


def pytest_collection_modifyitems(config, items):
    seen = set()
    for item in items:
        if item.path.name in WHOLE_PROGRAM_FILES:
            item.add_marker(pytest.mark.slow)
        if hasattr(item, "callspec"):
            key = (item.path, item.originalname, _axis_types_of(item))
            if key in seen:
                item.add_marker(pytest.mark.sweep)
            seen.add(key)


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """Frees every compiled program after each test module (`jax.clear_caches()`).

    XLA:CPU maps each program's code into its own memory areas, about 6 per small program,
    and JAX's caches keep every program alive. The whole suite compiles more programs than
    Linux's default limit of 65,530 areas per process (`vm.max_map_count`) allows: the compile
    that crosses it fails, and the error, thrown through the JIT-compiled code's unwind tables,
    ended the run with a segmentation fault (in `tests/test_linalg_transpose.py`, a quarter of
    the way through). Clearing after each module keeps the process well below the limit.
    """
    yield
    jax.clear_caches()
    gc.collect()


def pytest_report_header(config):
    return f"jax {jax.__version__}, {jax.device_count()} devices ({jax.default_backend()})"
