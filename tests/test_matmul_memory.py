"""Peak per-device memory of collective matmul and SUMMA, from the compiler's memory_analysis.

The bound is the local operands + the output + 2 panels (for a ring: the block in use and the
block in flight; for SUMMA: the A and B panels, each as broadcast send and receive buffer),
plus the product a step is adding. XLA's CPU backend writes every dot to a fresh buffer before
adding or placing it, so the kernels add products in tiles; the test checks

1. at 256^3 on 8 devices every ring form is within 8 KiB (loop counters, indices) of the bound
   without any product term;
2. at square and rectangular shapes on 1-D and 2-D meshes, every form stays within 1/P of the
   bound (P devices on the ring or grid), and far below holding a gathered operand;
3. the fitted method's ``peak_bytes`` is an upper bound (within 8 KiB) of the compiled peak,
   for every layout the ring fits, so ``explain`` and ``auto`` rank by true numbers.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.matmul import MatmulLayoutError
from shardkit.matmul._layout import layout_of
from shardkit.matmul._tiles import add_product
from shardkit.matmul.api import kernel
from shardkit.matmul.cost import fit

SLACK = 8192  # loop counters, indices and scalars
MESHES = {"8": ((8,), ("x",)), "2x4": ((2, 4), ("x", "y")), "4x2": ((4, 2), ("x", "y"))}

# (A spec, B spec, out_spec): one layout per ring form, the ring over mesh axis "x"
RING_FORMS = {
    "allgather-matmul, A rows travel": (("x", None), (None, "x"), None),
    "allgather-matmul, B cols travel": (("x", None), (None, "x"), ("x", None)),
    "allgather-matmul, A K-blocks travel": ((None, "x"), (None, None), None),
    "allgather-matmul, B K-blocks travel": ((None, None), ("x", None), None),
    "matmul-reduce-scatter, C rows travel": ((None, "x"), ("x", None), None),
    "matmul-reduce-scatter, C cols travel": ((None, "x"), ("x", None), (None, "x")),
}


def _mesh(name):
    shape, names = MESHES[name]
    return jax.make_mesh(shape, names, axis_types=(AxisType.Explicit,) * len(names))


def _measure(mesh, shape, sa, sb, algorithm, out=None, bidi=False):
    A = jax.ShapeDtypeStruct(shape[:2], jnp.float32, sharding=NamedSharding(mesh, P(*sa)))
    B = jax.ShapeDtypeStruct(shape[1:], jnp.float32, sharding=NamedSharding(mesh, P(*sb)))
    L = layout_of(A, B)
    method = fit(L, algorithm, out, bidirectional=bidi)
    mem = kernel(L, method, jnp.dtype(jnp.float32)).lower(A, B).compile().memory_analysis()
    used = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
    return L, method, used


def _panels(mesh, shape, L, method):
    """(2 panels in bytes, P) for a fitted collective or SUMMA method."""
    if method.algorithm == "summa":
        m, k, n = shape
        pr, pc = mesh.shape["x"], mesh.shape["y"]
        kb = k // np.lcm(pr, pc)
        return 2 * (m // pr * kb + kb * (n // pc)) * 4, pr * pc
    (perm,) = method.collectives
    p = mesh.shape[perm.axis]
    return 2 * (perm.nbytes // (p - 1)), p


@pytest.mark.parametrize("bidi", [False, True], ids=["uni", "bidi"])
@pytest.mark.parametrize("form", list(RING_FORMS))
def test_ring_within_bound_at_256(form, bidi):
    mesh = _mesh("8")
    sa, sb, out = RING_FORMS[form]
    L, method, used = _measure(mesh, (256, 256, 256), sa, sb, "collective", out, bidi)
    panels, _ = _panels(mesh, (256,) * 3, L, method)
    bound = L.a_bytes + L.b_bytes + L.c_bytes(method.out_spec) + panels
    assert used <= bound + SLACK, (form, used, bound)
    assert used <= method.peak_bytes + SLACK


CASES = [
    (mesh, shape, *RING_FORMS[form], "collective", bidi)
    for mesh in ("8", "2x4")
    for shape in ((256, 256, 256), (512, 128, 256), (128, 512, 256))
    for form in RING_FORMS
    for bidi in (False, True)
] + [
    (mesh, shape, ("x", "y"), ("x", "y"), None, "summa", False)
    for mesh in ("2x4", "4x2")
    for shape in ((256, 256, 256), (1024, 128, 1024), (128, 1024, 128))
]


@pytest.mark.parametrize("mesh_name,shape,sa,sb,out,algorithm,bidi", CASES)
def test_peak_is_blocks_plus_two_panels(mesh_name, shape, sa, sb, out, algorithm, bidi):
    mesh = _mesh(mesh_name)
    L, method, used = _measure(mesh, shape, sa, sb, algorithm, out, bidi)
    panels, p = _panels(mesh, shape, L, method)
    bound = L.a_bytes + L.b_bytes + L.c_bytes(method.out_spec) + panels
    assert used <= bound + bound // p, (used, bound, method.detail)
    assert used <= method.peak_bytes + SLACK, (used, method.peak_bytes, method.detail)
    if p >= 4:  # (with 2 devices the two panels are a whole operand)
        full = max(shape[0] * shape[1], shape[1] * shape[2]) * 4
        assert used < L.a_bytes + L.b_bytes + L.c_bytes(method.out_spec) + full


@pytest.mark.parametrize("mesh_name,shape", [("8", (128, 512, 256)), ("2x4", (256, 64, 512))])
def test_predicted_peak_bounds_every_ring_layout(mesh_name, shape):
    """Every layout the ring fits (any specs, any output, both directions)."""
    mesh = _mesh(mesh_name)
    axes = [None, *mesh.axis_names]
    specs = [s for s in itertools.product(axes, axes) if s[0] is None or s[0] != s[1]]
    checked = 0
    for sa, sb in itertools.product(specs, specs):
        for out, bidi in itertools.product([None, *specs], (False, True)):
            try:
                L, method, used = _measure(mesh, shape, sa, sb, "collective", out, bidi)
            except MatmulLayoutError:
                continue
            assert used <= method.peak_bytes + SLACK, (sa, sb, out, bidi, used, method)
            checked += 1
    assert checked >= 28


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("overwrite", [False, True])
def test_add_product_tiles_equal_one_product(axis, overwrite):
    """The tiled product with windows and an offset equals numpy's, for both cut axes."""
    rng = np.random.default_rng(axis + 2 * overwrite)
    a = rng.standard_normal((12, 10)).astype(np.float32)
    b = rng.standard_normal((9, 16)).astype(np.float32)
    c = rng.standard_normal((10, 20)).astype(np.float32)
    a_win, b_win, at = ((2, 8), (1, 6)), ((3, 6), (4, 12)), (1, 5)
    got = add_product(
        jnp.asarray(c),
        jnp.asarray(a),
        jnp.asarray(b),
        tiles=4,
        axis=axis,
        dtype=jnp.float32,
        a_win=a_win,
        b_win=b_win,
        at=jnp.asarray(at),  # traced offsets, as the kernels pass them
        overwrite=overwrite,
    )
    want = c.astype(np.float64)
    prod = a[2:10, 1:7].astype(np.float64) @ b[3:9, 4:16]
    want[1:9, 5:17] = prod if overwrite else want[1:9, 5:17] + prod
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-5)
