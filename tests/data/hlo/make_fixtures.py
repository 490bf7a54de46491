"""Writes the compiled-HLO fixtures of `tests/test_inspection_fixtures.py` for the running JAX.

Run it once per supported JAX (the file names carry the version) so the HLO reader is tested on
the text each version prints, with no compile in the test itself:

    python tests/data/hlo/make_fixtures.py

Programs: the scaling book's matmul case 2 on a 4 x 2 mesh (an all-gather the partitioner
inserts over 'y'), a shard_map psum over 'x' inside a 5-step fori_loop, and an all-to-all over
both mesh axes, and ``jnp.fft.fftn`` on an array split over both mesh axes (gathered over 'y'
then 'x' in 0.10.2 and 0.12).
"""

import os
import pathlib

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

HERE = pathlib.Path(__file__).parent


def programs():
    mesh = jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Auto,) * 2)

    def sds(shape, spec):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))

    def matmul(a, b):
        return jax.lax.with_sharding_constraint(a @ b, NamedSharding(mesh, P()))  # LINE matmul

    yield "matmul_case2", matmul, (sds((64, 32), P(None, "y")), sds((32, 64), P()))

    def loop_psum(x):
        def body(_, c):
            summed = jax.lax.psum(c, "x")  # LINE psum
            return jax.lax.pcast(summed, "x", to="varying") * 0.5

        f = jax.shard_map(
            lambda c: jax.lax.fori_loop(0, 5, body, c), mesh=mesh, in_specs=P("x"), out_specs=P("x")
        )
        return f(x)

    yield "loop_psum", loop_psum, (sds((16, 8), P("x")),)

    def a2a(x):
        f = jax.shard_map(
            lambda c: jax.lax.all_to_all(c, ("x", "y"), 0, 1, tiled=True),  # LINE all_to_all
            mesh=mesh,
            in_specs=P(("x", "y")),
            out_specs=P(None, ("x", "y")),
        )
        return f(x)

    yield "all_to_all", a2a, (sds((64, 64), P(("x", "y"))),)

    def fftn(x):
        return jnp.fft.fftn(x)  # LINE fftn

    cplx = jax.ShapeDtypeStruct(
        (32, 32, 32), jnp.complex64, sharding=NamedSharding(mesh, P("x", "y"))
    )
    yield "fftn", fftn, (cplx,)


if __name__ == "__main__":
    for name, fn, args in programs():
        text = jax.jit(fn).lower(*args).compile().as_text()
        path = HERE / f"{name}-jax{jax.__version__}.txt"
        path.write_text(text)
        print(path.name, len(text))
