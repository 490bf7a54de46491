"""The user boundary of rings, overlap, placement, layout views, meshes and byte counts, as the
JAX sharding tutorials (shard_map collectives, rings, collective matmul) use them: results
against a single-device reference (float32, 1e-5 relative and absolute unless exact), and
bad input refused with errors that name the argument and end with a fix."""

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.collectives import bytes_moved
from shardkit.layout import layout_of, show, spec_notation, tree_table
from shardkit.mesh import (
    MeshError,
    describe_mesh,
    fill_rest,
    make_mesh,
    mesh_axis_sizes,
    mesh_table,
    simulate_cpu_devices,
)
from shardkit.overlap import all_gather_matmul
from shardkit.placement import constrain, sequence_parallel, split_sequence
from shardkit.rings import ring_gather, ring_reduce_scatter

# --- rings --------------------------------------------------------------------------------


def _gather(mesh, x, *, p=8, bidirectional=False, check_vma=True):
    """Every device gathers the (16, 3) array split over "x" with `ring_gather`."""

    def body(block):
        def consume(acc, piece, start):
            return lax.dynamic_update_slice_in_dim(acc, piece, start, 0)

        acc = jnp.zeros((block.shape[0] * 8, block.shape[1]), block.dtype)
        return ring_gather(block, "x", p, 0, consume, acc, bidirectional)

    f = jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=check_vma)
    return f(x)


def _mesh8():
    return make_mesh({"x": 8}, axis_types="auto")


@pytest.mark.parametrize("bidirectional", [False, True])
def test_ring_gather_in_a_default_shard_map(bidirectional):
    # shard_map's default check_vma=True: the loop carry starts invariant (zeros) and becomes
    # varying after a ppermute; that raised a raw scan-carry TypeError
    x = jnp.arange(48, dtype=jnp.float32).reshape(16, 3)
    out = np.asarray(_gather(_mesh8(), x, bidirectional=bidirectional)).reshape(8, 16, 3)
    for device in range(8):
        np.testing.assert_array_equal(out[device], x)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_ring_reduce_scatter_in_a_default_shard_map(bidirectional):
    y = jnp.arange(8 * 16, dtype=jnp.float32).reshape(8, 16)  # one row of parts per device

    def body(row):
        part = lambda start, length: lax.dynamic_slice_in_dim(row[0], start, length)
        out = ring_reduce_scatter(part, "x", 8, 2, bidirectional)
        return jnp.concatenate(out) if bidirectional else out

    f = jax.shard_map(body, mesh=_mesh8(), in_specs=P("x"), out_specs=P("x"))
    np.testing.assert_array_equal(f(y), np.asarray(y).sum(0))


def test_ring_with_a_wrong_device_count_is_refused():
    # p=4 on an 8-device axis gathered the wrong blocks, silently
    x = jnp.arange(48, dtype=jnp.float32).reshape(16, 3)
    with pytest.raises(ValueError, match=r"p=4 but mesh axis 'x' has size 8.*fix: p=8"):
        _gather(_mesh8(), x, p=4, check_vma=False)


def test_ring_outside_shard_map_says_where_it_runs():
    with pytest.raises(ValueError, match=r"ring_gather: mesh axis 'x' is not bound.*fix:"):
        ring_gather(jnp.ones(4), "x", 8, 0, lambda a, p, s: a, jnp.zeros(32), False)


def test_bidirectional_reduce_scatter_of_an_odd_block_is_refused():
    # size=3: the two halves were 1 + 1 rows, the third silently dropped
    def body(row):
        part = lambda start, length: lax.dynamic_slice_in_dim(row[0], start, length)
        return jnp.concatenate(ring_reduce_scatter(part, "x", 8, 3, True))

    f = jax.shard_map(body, mesh=_mesh8(), in_specs=P("x"), out_specs=P("x"))
    with pytest.raises(ValueError, match=r"size=3 is odd.*fix: bidirectional=False"):
        f(jnp.ones((8, 24)))


# --- placement.constrain ------------------------------------------------------------------


def _placed(axis_type):
    mesh = make_mesh({"data": 2, "model": 4}, axis_types=axis_type)
    x = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    return mesh, jax.device_put(x, NamedSharding(mesh, P("data", None)))


@pytest.mark.parametrize(
    "spec, match",
    [
        (
            P("modle", None),
            r"mesh axis 'modle', but the mesh has axes \{'data': 2, 'model': 4\}.*fix",
        ),
        ("modl", r"mesh axis 'modl',.*fix"),  # a bare string is one mesh axis, not letters
    ],
)
def test_constrain_refuses_mesh_axes_the_mesh_lacks(axis_type, spec, match):
    # an unknown mesh axis (or each letter of a bare string) was dropped: silently replicated
    mesh, x = _placed(axis_type)
    with pytest.raises(ValueError, match=match):
        jax.jit(lambda v: constrain(v, mesh, spec))(x)


def test_constrain_takes_one_mesh_axis_as_a_string(axis_type):
    mesh, x = _placed(axis_type)
    y = jax.jit(lambda v: constrain(v, mesh, "model"))(x)
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, P("model", None)), 2)


def test_constrain_leaves_unconstrained_dims_free(axis_type):
    # P.UNCONSTRAINED became None: the dim was forced whole instead of left as it is
    mesh, x = _placed(axis_type)
    f = jax.jit(lambda v: constrain(v, mesh, P(P.UNCONSTRAINED, "model")))
    y = f(x)
    np.testing.assert_array_equal(y, x)
    if axis_type == AxisType.Explicit:  # the type keeps its split
        assert y.sharding.spec == P("data", "model")
    else:  # the constraint leaves dim 0 to the compiler
        assert '[{?}, {"model"}]' in f.lower(x).as_text()


# --- placement.sequence_parallel and overlap ------------------------------------------------


@pytest.mark.parametrize(
    "axis, batch, match",
    [
        ("tensr", (), r"mesh axis 'tensr', but the mesh has axes \{'data': 2, 'model': 4\}.*fix"),
        ("model", ("dta",), r"mesh axis 'dta',.*fix"),
        ("model", ("model",), r"mesh axis 'model' twice.*fix"),
    ],
)
def test_sequence_parallel_refuses_unknown_mesh_axes(axis_type, axis, batch, match):
    # a misspelt axis turned sequence parallelism off without a word (and on Explicit axes an
    # unknown or repeated batch axis was ignored)
    mesh = make_mesh({"data": 2, "model": 4}, axis_types=axis_type)
    with pytest.raises(ValueError, match=match), sequence_parallel(mesh, axis, batch):
        pass


def test_sequence_parallel_takes_one_batch_axis_as_a_string():
    mesh = make_mesh({"data": 2, "model": 4}, axis_types="auto")
    x = jax.device_put(jnp.ones((2, 8, 4)), NamedSharding(mesh, P()))
    with sequence_parallel(mesh, "model", "data"):
        y = jax.jit(lambda v: split_sequence(v) + 0)(x)
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, P("data", "model")), 3)


@pytest.mark.parametrize("ring", [True, False])
def test_overlap_with_a_batch_the_batch_axes_do_not_divide(ring):
    # B=3 over data=2 on Auto axes: shard_map refused its internal `body`
    mesh = make_mesh({"data": 2, "tensor": 4}, axis_types="auto")
    k1, k2 = jax.random.split(jax.random.key(0))
    x, w = jax.random.normal(k1, (3, 16, 8)), jax.random.normal(k2, (8, 8))

    def f(x, w):
        with sequence_parallel(mesh, "tensor", ("data",), collective_matmul=ring):
            return all_gather_matmul("btd,df->btf", x, w, split=1)

    np.testing.assert_allclose(jax.jit(f)(x, w), x @ w, rtol=1e-5, atol=1e-5)


# --- meshes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sizes, match",
    [
        ({"a": -1, "b": -1}, r"at most one size may be -1"),  # was {'a': 8, 'b': 8}
        ({"a": 0, "b": -1}, r"'a' has size 0"),  # was ZeroDivisionError
        ({"a": -2, "b": 2}, r"'a' has size -2"),  # was passed through
    ],
)
def test_fill_rest_refuses_bad_sizes(sizes, match):
    with pytest.raises(MeshError, match=match + r".*fix:"):
        fill_rest(sizes, 8)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: make_mesh({"a": 8}, axis_types=None), r"axis_types=None.*fix:"),
        (lambda: make_mesh("data"), r"make_mesh\('data'\).*fix: make_mesh\(\{'data': 8\}\)"),
    ],
)
def test_make_mesh_bad_arguments(call, match):
    with pytest.raises(MeshError, match=match):
        call()


def test_make_mesh_takes_any_iterable_of_devices():
    mesh = make_mesh({"a": 2, "b": 4}, devices=(d for d in reversed(jax.devices())))
    assert [d.id for d in mesh.devices.flat] == list(range(7, -1, -1))


@pytest.mark.parametrize("fn", [describe_mesh, mesh_table, mesh_axis_sizes])
def test_mesh_views_refuse_what_is_not_a_mesh(fn):
    sharding = NamedSharding(make_mesh({"data": 8}), P())
    with pytest.raises(TypeError, match=rf"{fn.__name__}: mesh is NamedSharding.*\.mesh\)"):
        fn(sharding)


def test_simulate_cpu_devices_takes_numpy_integers_and_refuses_bools():
    simulate_cpu_devices(np.int64(jax.device_count()))  # already started with that many: ok
    with pytest.raises(ValueError, match=r"n must be an integer >= 1, got True"):
        simulate_cpu_devices(True)


# --- byte counts ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, error, match",
    [
        (("all-reduce", -100, 4), ValueError, r"nbytes=-100 is negative"),
        (("all-reduce", 100, 0), ValueError, r"size=0 is not a whole number"),
        (("all-gather", 100, 2.5), ValueError, r"size=2.5 is not a whole number"),
        ((["all-gather"], 100, 4), TypeError, r"kind is list"),
        (("all-reduce", "100", 4), TypeError, r"nbytes='100' is str"),
    ],
)
def test_bytes_moved_refuses_bad_input(args, error, match):
    with pytest.raises(error, match=match + r".*fix:"):
        bytes_moved(*args)


def test_bytes_moved_still_counts():
    assert bytes_moved("all-reduce", 1000, np.int64(4)) == 1500.0
    assert bytes_moved("collective-permute", 64, 0) == 64.0  # a permute moves its operand


# --- layout views -----------------------------------------------------------------------------


def test_tree_table_of_arrays_on_two_meshes_reports_no_error():
    # the second leaf was linted against the first leaf's mesh: "(error: unknown-axis)"
    on8 = jax.device_put(jnp.ones(8), NamedSharding(make_mesh({"x": 8}), P("x")))
    half = make_mesh({"s": 4}, devices=jax.devices()[4:])
    on4 = jax.device_put(jnp.ones(8), NamedSharding(half, P("s")))
    rows = tree_table({"a": on8, "b": on4})
    assert [(r["spec"], r["bytes_per_device"]) for r in rows] == [("[A_x]", 4), ("[A_s]", 8)]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"shape": (8.5,)}, ValueError, r"shape=\(8.5,\) is not a sequence of integer"),  # was 8
        ({"shape": 8}, ValueError, r"shape=8 is not a sequence"),
        ({"shape": (8,), "dtype": "flot32"}, TypeError, r"dtype='flot32' is not a dtype"),
        ({"shape": (8,), "mesh": {"x": 8}}, TypeError, r"mesh is dict"),
        ({"shape": (8,), "mesh": None, "sharding": P("x")}, TypeError, r"sharding=P\('x',\)"),
    ],
)
def test_layout_of_bad_arguments(kwargs, error, match):
    kwargs = {"mesh": make_mesh({"x": 8}), "spec": P("x"), **kwargs}
    with pytest.raises(error, match=match + r".*fix:"):
        layout_of(**kwargs)


def test_show_refuses_dims_that_are_not_integers():
    with pytest.raises(ValueError, match=r"dim 'a' is out of range.*fix: integer dims in -2..1"):
        show(shape=(8, 8), mesh=make_mesh({"x": 8}), spec=P("x"), dims="ab", file=io.StringIO())


def test_spec_notation_refuses_a_bare_string():
    # "data" was read as four spec entries: "spec data has 4 entries"
    with pytest.raises(TypeError, match=r"spec is str 'data'.*fix: spec_notation\(shape, P"):
        spec_notation((16, 16), "data")
