"""`shardkit.placement.constrain` on Auto, Explicit and mixed meshes: the layout asked for."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.mesh import make_mesh
from shardkit.placement import constrain, constrain_tree

KINDS = {
    "auto": (AxisType.Auto, AxisType.Auto),
    "explicit": (AxisType.Explicit, AxisType.Explicit),
    "mixed": (AxisType.Explicit, AxisType.Auto),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "start,want",
    [(P("a", None), P(None, "b")), (P("a", None), P("a", "b")), (P(None, "b"), P()),
     (P(("a", "b"), None), P(None, ("b", "a")))],
)  # fmt: skip
def test_constrain_lays_out_as_asked(kind, start, want):
    mesh = make_mesh({"a": 2, "b": 4}, axis_types=KINDS[kind])
    x = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    placed = jax.device_put(x, NamedSharding(mesh, start))
    y = jax.jit(lambda v: constrain(v * 2, mesh, want), out_shardings=None)(placed)
    np.testing.assert_array_equal(y, 2 * x)
    if kind == "mixed" and want == P(None, ("b", "a")):
        want = P(None, ("a", "b"))  # within a dim, the Explicit axes come first (the type's)
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, want), 2)


def test_constrain_tree_and_sequence_specs():
    mesh = make_mesh({"a": 2, "b": 4}, axis_types=KINDS["mixed"])
    tree = {"w": jnp.ones((8, 4)), "b": jnp.ones((4,))}
    specs = {"w": P("a", "b"), "b": P(None)}
    out = jax.jit(lambda t: constrain_tree(t, mesh, specs))(tree)
    assert out["w"].sharding.is_equivalent_to(NamedSharding(mesh, P("a", "b")), 2)
    y = jax.jit(lambda v: constrain(v, mesh, ["a", None]))(jnp.ones((8, 4)))
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, P("a", None)), 2)
