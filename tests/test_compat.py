"""The JAX support range: private JAX uses live in one module; versions are reported."""

import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import jaxlib.version
import pytest

from shardkit import compat

ROOT = pathlib.Path(__file__).resolve().parent.parent
PRIVATE = re.compile(r"\bjax\._src\b|\bfrom jax import _src\b|\bjaxlib\._jax\b")


def test_no_private_jax_import_outside_compat():
    offenders = []
    for folder in ("src", "examples", "benchmarks", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "compat.py" or path == pathlib.Path(__file__).resolve():
                continue
            for i, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if PRIVATE.search(code) and ("import" in code or "jax._src." in code):
                    offenders.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert offenders == []


def test_the_checker_sees_a_private_import(tmp_path):
    # the pattern above must catch the forms a private import takes
    for line in ("from jax._src import xla_bridge", "import jax._src.distributed as d",
                 "x = jax._src.core.Tracer"):  # fmt: skip
        assert PRIVATE.search(line)
    assert not PRIVATE.search("import jax.extend.core")


def test_versions_name_shardkit_jax_and_jaxlib():
    v = compat.versions()
    assert v["jax"] == jax.__version__
    assert v["jaxlib"] == jaxlib.version.__version__
    assert set(v) == {"shardkit", "jax", "jaxlib"}
    assert (
        compat.version_line() == f"shardkit {v['shardkit']}, jax {v['jax']}, jaxlib {v['jaxlib']}"
    )


def test_cli_version_prints_the_three_versions():
    out = subprocess.run(
        [sys.executable, "-m", "shardkit.cli", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == compat.version_line()
    assert f"jax {jax.__version__}," in out.stdout


def test_backend_started_after_a_computation():
    jnp.zeros(1).block_until_ready()
    assert compat.backend_started() is True


def test_distributed_client_is_none_when_alone():
    assert compat.distributed_client() is None


def test_context_mesh_is_set_meshs_mesh_also_under_grad():
    mesh = jax.make_mesh((8,), ("x",))
    assert compat.context_mesh().empty
    seen = []

    def loss(v):
        seen.append(compat.context_mesh())  # jax.sharding.get_mesh() refuses here
        return jnp.sum(v)

    with jax.set_mesh(mesh):
        jax.grad(loss)(jnp.ones(8))
    assert seen == [mesh]


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_parts_counts_consts_and_carries(reverse):
    w = jnp.ones((2, 2))

    def f(c, xs):
        def body(c, x):
            return (c[0] @ w * x[0] + 1.0, c[1] * 2.0), (c[0], x[1] * 3.0)

        return jax.lax.scan(body, c, xs, reverse=reverse)

    args = ((jnp.ones((2, 2)), 1.0), (jnp.ones((3,)), jnp.ones((3, 4))))
    (eqn,) = [e for e in jax.make_jaxpr(f)(*args).jaxpr.eqns if e.primitive.name == "scan"]
    nc, nk, body, consts = compat.scan_parts(eqn.params)
    # w is a const of the body; the two carries; the two xs
    assert (nc, nk) == (1, 2)
    assert nc + nk + 2 == len(eqn.invars) == len(body.invars)
    assert len(body.outvars) == nk + 2 and consts == ()


def test_expected_lines_keep_only_this_versions_tagged_lines():
    from expected import for_this_jax

    lines = ["same", "old figure [jax 0.10]", "new figure [jax 0.12]"]
    assert for_this_jax(lines, "0.12.0.1") == ["same", "new figure"]
    assert for_this_jax(lines, "0.10.2") == ["same", "old figure"]
