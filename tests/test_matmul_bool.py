"""Boolean matmul with every algorithm equals jnp.matmul's: dtype bool, entry (i, j) True when
some k has A[i, k] and B[k, j] (exact: no tolerance)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit
from tests.test_matmul import CASES, MESHES


def _bool_operands(mesh, sa, sb, shape):
    m, k, n = shape
    rng = np.random.default_rng(1)
    # sparse enough that many entries of C are False, dense enough that many counts exceed 1
    a, b = rng.random((m, k)) < 0.02, rng.random((k, n)) < 0.02
    a[:, :] |= np.eye(m, k, dtype=bool)  # and at least K = 128 terms in some sums
    a[0, :] = True
    b[:, 0] = True
    return (
        a,
        b,
        jax.device_put(a, NamedSharding(mesh, P(*sa))),
        jax.device_put(b, NamedSharding(mesh, P(*sb))),
    )


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[3]}-{i}" for i, c in enumerate(CASES)])
def test_bool_matmul_matches_jnp(case):
    mesh_name, sa, sb, algorithm, out_spec, bidirectional, expected = case
    shape, names = MESHES[mesh_name]
    mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Explicit,) * len(names))
    a, b, A, B = _bool_operands(mesh, sa, sb, (64, 128, 64))
    ref = jnp.matmul(jnp.asarray(a), jnp.asarray(b))
    assert ref.dtype == jnp.bool_
    c = shardkit.matmul(A, B, algorithm=algorithm, out_spec=out_spec, bidirectional=bidirectional)
    assert c.dtype == jnp.bool_
    np.testing.assert_array_equal(np.asarray(c), np.asarray(ref))
    assert c.sharding.is_equivalent_to(NamedSharding(mesh, P(*expected)), 2)
    assert 0 < int(np.asarray(ref).sum()) < ref.size  # both values occur
