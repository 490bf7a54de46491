"""Meshes: shapes, names, axis types, device subsets, fallback, descriptions, bad input."""

import os
import subprocess
import sys

import jax
import pytest
from jax.sharding import AxisType

import shardkit as sk
from shardkit.mesh import MeshError, describe_mesh, make_mesh, mesh_table, simulate_cpu_devices


def test_dict_and_rest(axis_type):
    mesh = make_mesh({"data": 4, "model": -1}, axis_types=axis_type)
    assert dict(mesh.shape) == {"data": 4, "model": 2}
    assert mesh.axis_types == (axis_type, axis_type)
    assert sorted(d.id for d in mesh.devices.flat) == list(range(8))


def test_shape_and_names_and_default_is_explicit():
    mesh = make_mesh((2, 2, 2), ("a", "b", "c"))
    assert dict(mesh.shape) == {"a": 2, "b": 2, "c": 2}
    assert mesh.axis_types == (AxisType.Explicit,) * 3


def test_mixed_axis_types():
    mesh = make_mesh({"data": 4, "model": 2}, axis_types=("auto", AxisType.Explicit))
    assert mesh.axis_types == (AxisType.Auto, AxisType.Explicit)


def test_subset_of_devices_half_mesh():
    devs = jax.devices()[4:]
    mesh = make_mesh({"x": 2, "y": 2}, devices=devs)
    assert sorted(d.id for d in mesh.devices.flat) == [4, 5, 6, 7]
    assert "cpu:4-7" in describe_mesh(mesh)


def test_fallback_is_opt_in_and_warns():
    with pytest.raises(MeshError, match=r"needs 16 devices but 8 were given.*allow_fallback"):
        make_mesh({"data": 4, "model": 4})
    with pytest.warns(UserWarning, match="falling back to a 1-D mesh"):
        mesh = make_mesh({"data": 4, "model": 4}, allow_fallback=True)
    assert dict(mesh.shape) == {"data": 8}


def test_describe_and_table():
    mesh = make_mesh({"data": 2, "model": 4}, axis_types="auto")
    assert describe_mesh(mesh) == "Mesh(data=2, model=4; auto; 8 devices cpu:0-7, 1 process)"
    table = mesh_table(mesh).splitlines()
    assert table[1].split() == ["data\\model", "0", "1", "2", "3"]
    assert table[2].split() == ["0", "0", "1", "2", "3"]
    assert table[3].split() == ["1", "4", "5", "6", "7"]


def test_lazy_top_level_names():
    assert sk.make_mesh is make_mesh
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        sk.nope  # noqa: B018


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            dict(axes={"data": 3}),
            r"needs 3 devices but 8 were given.*devices=jax.devices\(\)\[:3\]",
        ),
        (dict(axes={"data": -1, "model": -1}), "at most one mesh axis may be -1"),
        (dict(axes={"data": 3, "model": -1}), "not divisible by the other mesh axes' product 3"),
        (dict(axes={"data": 0}), "sizes must be >= 1"),
        (dict(axes={"data": 2.5}), "sizes must be integers"),
        (dict(axes=(2, 4)), r"needs axis_names.*make_mesh\(\(2, 4\), \('axis_0', 'axis_1'\)\)"),
        (dict(axes=(2, 4), axis_names=("a",)), "has 2 mesh axes but axis_names"),
        (dict(axes=(2, 4), axis_names=("a", "a")), r"must be unique; \['a'\] repeat"),
        (dict(axes={"d": 8}, axis_names=("d",)), "either"),
        (dict(axes={"d": 8}, axis_types="sideways"), "unknown mesh axis type 'sideways'"),
        (dict(axes={"d": 4, "m": 2}, axis_types=("auto",)), "1 entries but the mesh has 2"),
        (dict(axes={}), "at least one mesh axis"),
        (
            dict(axes=[("a", 2), ("b", 4)]),
            r"\(name, size\) pairs; fix: make_mesh\(\{'a': 2, 'b': 4\}\)",
        ),
        (dict(axes={"d": 1}, devices=[]), "devices is empty"),
    ],
)
def test_bad_meshes(kwargs, match):
    axes = kwargs.pop("axes")
    with pytest.raises(MeshError, match=match):
        make_mesh(axes, **kwargs)


def test_simulate_after_start_is_refused():
    jax.devices()  # the backend is running (8 devices from conftest)
    simulate_cpu_devices(8)  # same count: fine, nothing to do
    with pytest.raises(RuntimeError, match=r"already started with 8 cpu.*fix: call"):
        simulate_cpu_devices(4)
    with pytest.raises(ValueError, match="integer >= 1"):
        simulate_cpu_devices(0)


@pytest.mark.parametrize(
    ("env", "n", "want"),
    [(None, 4, "4"), ("12", 4, "12"), (None, 1, None)],
    ids=["set-for-simulated-devices", "the-users-value-wins", "one-device-untouched"],
)
def test_simulate_quiets_openblas_workers_before_lapack_loads(env, n, want):
    # A fresh process: OpenBLAS reads OPENBLAS_THREAD_TIMEOUT when it loads, at the first
    # LAPACK call, so the setting must be in the environment by then.
    script = (
        "import os, jax.numpy as jnp, shardkit as sk\n"
        f"sk.simulate_cpu_devices({n})\n"
        "x = jnp.linalg.solve(jnp.eye(3) * 2.0, jnp.ones(3))\n"
        "assert float(x[0]) == 0.5\n"
        "print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))\n"
    )
    environ = {
        k: v for k, v in os.environ.items() if k not in ("OPENBLAS_THREAD_TIMEOUT", "XLA_FLAGS")
    }
    if env is not None:
        environ["OPENBLAS_THREAD_TIMEOUT"] = env
    out = subprocess.run(
        [sys.executable, "-c", script], env=environ, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == str(want)
