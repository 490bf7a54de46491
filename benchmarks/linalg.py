"""Distributed dense solve and CG: shardkit vs sharded and single-device `jnp`.

Runs on 8 simulated CPU devices and prints, side by side in one run, per matrix size N:

* time of `shardkit.linalg.solve` (1-D column-block-cyclic over 8 devices, and on a 2 x 4
  process grid), of `jnp.linalg.solve` on the same row-sharded matrix (which
  all-gathers it) and of `jnp.linalg.solve` on one device, each as the best of interleaved
  rounds, with the ratios sharded-jnp / shardkit (> 1: shardkit faster) and shardkit / one device;
* per-device memory (arguments + outputs + temporaries, from `memory_analysis()`) in MiB and as
  a multiple of the local shard L = N^2 / P, and shardkit / sharded-jnp;
* the collectives of each compiled program;
* the relative residual ||Ax - b|| / (||A|| ||x|| + ||b||) of each;

then CG on a 2-D Poisson matrix: iterations and time of `shardkit.linalg.cg` (plain and Jacobi)
vs `jax.scipy.sparse.linalg.cg` on the sharded and on a single-device matrix.

Simulated devices share the CPU cores, so only ratios within one run mean anything, and no
distributed variant can beat one device on CPU (the point on CPU is memory and no gather).
The devices are set up by `shardkit.simulate_cpu_devices(8)`, which also sets
`OPENBLAS_THREAD_TIMEOUT=4` (idle OpenBLAS workers sleep instead of spinning on the shared
cores) unless the environment sets it; both the distributed and the one-device solves run under
it, and the header line prints it. `OPENBLAS_THREAD_TIMEOUT=28` restores OpenBLAS's default.

    python benchmarks/linalg.py                     # N = 1024, 2048, 4096
    python benchmarks/linalg.py --sizes 512 1024    # quicker
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit.linalg as sl
from shardkit.inspection.hlo import collective_counts
from shardkit.linalg.layout import block_size_for
from shardkit.mesh import simulate_cpu_devices

MIB = 2**20
ABBREV = {"all-gather": "AG", "all-reduce": "AR", "all-to-all": "A2A", "collective-permute": "CP",
          "reduce-scatter": "RS", "collective-broadcast": "CB"}  # fmt: skip


def _compile(fn, *args):
    compiled = jax.jit(fn).lower(*args).compile()
    mem = compiled.memory_analysis()
    total = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
    counts = collective_counts(compiled.as_text())
    colls = " ".join(f"{ABBREV[k]}{v}" for k, v in counts.items() if v) or "none"
    return compiled, total, colls


def _best_times(fns, args, rounds):
    """Best wall time of each compiled function over interleaved rounds (after a warm-up)."""
    for f, a in zip(fns, args, strict=True):
        jax.block_until_ready(f(*a))
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, (f, a) in enumerate(zip(fns, args, strict=True)):
            t0 = time.perf_counter()
            jax.block_until_ready(f(*a))
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def _relres(a, x, b):
    a, x, b = (np.asarray(v, np.float64) for v in (a, x, b))
    return np.linalg.norm(a @ x - b) / (
        np.linalg.norm(a, 2) * np.linalg.norm(x) + np.linalg.norm(b)
    )


def bench_solve(n, rounds, nb):
    nb = block_size_for(nb, n, 8)  # shardkit's default unless --block-size
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))  # jnp needs Auto axes
    ka, kb = jax.random.split(jax.random.key(n))
    a_host = jax.random.normal(ka, (n, n), jnp.float32)
    b_host = jax.random.normal(kb, (n,), jnp.float32)
    a = jax.device_put(a_host, NamedSharding(mesh, P("x", None)))
    b = jax.device_put(b_host, NamedSharding(mesh, P()))
    one = jax.devices()[0]
    a1, b1 = jax.device_put(a_host, one), jax.device_put(b_host, one)
    ours, m_ours, c_ours = _compile(lambda a, b: sl.solve(a, b, mesh=mesh, block_size=nb), a, b)
    mesh2 = jax.make_mesh((2, 4), ("r", "c"), axis_types=(AxisType.Auto,) * 2)
    a2 = jax.device_put(a_host, NamedSharding(mesh2, P(("r", "c"), None)))
    b2 = jax.device_put(b_host, NamedSharding(mesh2, P()))
    grid, m_grid, c_grid = _compile(
        lambda a, b: sl.solve(a, b, mesh=mesh2, block_size=nb, grid=("r", "c")), a2, b2
    )
    jnp_sh, m_jnp, c_jnp = _compile(jnp.linalg.solve, a, b)
    single, m_one, c_one = _compile(jnp.linalg.solve, a1, b1)
    t_ours, t_grid, t_jnp, t_one = _best_times(
        [ours, grid, jnp_sh, single], [(a, b), (a2, b2), (a, b), (a1, b1)], rounds
    )
    shard = n * n * 4 / 8
    print(f"\nN = {n} (float32, nb = {nb}, mesh (8,) Auto, A row-sharded; L = N^2/P = "
          f"{shard / MIB:.2f} MiB)")  # fmt: skip
    print(
        f"  {'method':<26} {'time ms':>9} {'mem MiB':>8} {'mem/L':>6}  {'collectives':<16} relres"
    )
    for name, t, m, c, x in [
        ("shardkit.linalg.solve", t_ours, m_ours, c_ours, ours(a, b)),
        ("shardkit solve, grid 2x4", t_grid, m_grid, c_grid, grid(a2, b2)),
        ("jnp.linalg.solve sharded", t_jnp, m_jnp, c_jnp, jnp_sh(a, b)),
        ("jnp.linalg.solve 1 device", t_one, m_one, c_one, single(a1, b1)),
    ]:
        print(f"  {name:<26} {t * 1e3:9.1f} {m / MIB:8.2f} {m / shard:6.1f}  {c:<16} "
              f"{_relres(a_host, x, b_host):.1e}")  # fmt: skip
    print(f"  ratios: sharded-jnp / shardkit time {t_jnp / t_ours:.2f}x; shardkit / one device "
          f"{t_ours / t_one:.2f}x; shardkit / sharded-jnp memory {m_ours / m_jnp:.2f}")  # fmt: skip
    print(f"  targets: shardkit / one device <= 3.0: {t_ours / t_one <= 3.0}; memory <= 3 L: "
          f"{m_ours <= 3 * shard}; no all-gather: {'AG' not in c_ours}")  # fmt: skip


def poisson_2d(m):
    t = 2 * np.eye(m) - np.eye(m, k=1) - np.eye(m, k=-1)
    return (np.kron(t, np.eye(m)) + np.kron(np.eye(m), t)).astype(np.float32)


def bench_cg(m, rounds):
    n = m * m
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    a_host = jnp.asarray(poisson_2d(m))
    b_host = jnp.ones((n,), jnp.float32)
    a = jax.device_put(a_host, NamedSharding(mesh, P("x", None)))
    b = jax.device_put(b_host, NamedSharding(mesh, P("x")))
    one = jax.devices()[0]
    a1, b1 = jax.device_put(a_host, one), jax.device_put(b_host, one)
    tol, maxiter = 1e-5, 10 * n
    scipy_cg = lambda a, b: jax.scipy.sparse.linalg.cg(a, b, tol=tol, maxiter=maxiter)[0]
    variants = [
        ("shardkit cg", lambda a, b: sl.cg(a, b, mesh=mesh, tol=tol, maxiter=maxiter), (a, b)),
        ("shardkit cg + jacobi",
         lambda a, b: sl.cg(a, b, mesh=mesh, tol=tol, maxiter=maxiter, preconditioner="jacobi"),
         (a, b)),
        ("jax.scipy cg sharded", scipy_cg, (a, b)),
        ("jax.scipy cg 1 device", scipy_cg, (a1, b1)),
    ]  # fmt: skip
    compiled = [_compile(f, *args) for _, f, args in variants]
    times = _best_times([c[0] for c in compiled], [v[2] for v in variants], rounds)
    print(f"\nCG on the 2-D Poisson matrix, {m} x {m} grid (N = {n}, dense, row-sharded), "
          f"tol {tol}")  # fmt: skip
    print(f"  {'method':<24} {'iters':>6} {'time ms':>9}  {'collectives':<12} ||Ax-b||/||b||")
    for (name, _, args), (c, _, colls), t in zip(variants, compiled, times, strict=True):
        out = c(*args)
        x, iters = (out[0], int(out[1].iterations)) if isinstance(out, tuple) else (out, None)
        res = np.linalg.norm(np.asarray(a_host) @ np.asarray(x) - 1) / np.sqrt(n)
        shown = "-" if iters is None else str(iters)
        print(f"  {name:<24} {shown:>6} {t * 1e3:9.1f}  {colls:<12} {res:.1e}")
    print(f"  ratio: jax.scipy sharded / shardkit time {times[2] / times[0]:.2f}x "
          "(the Poisson diagonal is constant, so Jacobi cannot cut iterations here)")  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--block-size", type=int, default=None, help="nb (default: shardkit's own choice from N)"
    )
    parser.add_argument("--grid", type=int, default=48, help="CG Poisson grid side (N = grid^2)")
    args = parser.parse_args()
    simulate_cpu_devices(8)
    print(f"jax {jax.__version__}, {jax.device_count()} {jax.default_backend()} devices, "
          f"{os.cpu_count()} cores, OPENBLAS_THREAD_TIMEOUT="
          f"{os.environ.get('OPENBLAS_THREAD_TIMEOUT')}")  # fmt: skip
    for n in args.sizes:
        bench_solve(n, args.rounds, args.block_size)
    bench_cg(args.grid, args.rounds)


if __name__ == "__main__":
    main()
