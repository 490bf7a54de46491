"""Particle-mesh on a sharded grid: cloud-in-cell paint, a Poisson solve, read-out at particles.

Each of the 8 devices (a 2x4 mesh) holds the particles inside its own part of a periodic 32^3
box, and the grid cells of that part (`rho[X_x, Y_y, Z]`). A particle deposits its mass on the
8 cells around it (cloud in cell), so one near a shard's edge also deposits into the next
shard's cells: each device paints into its block plus one ghost cell per side, and
`halo_accumulate` adds the ghosts into the shards that own them. The potential of the painted
density comes from `prfft3d`/`pirfft3d`; `halo_exchange` then gives each shard the neighbouring
cells its particles read the potential from. Everything is compared with the same computation
in numpy on one device.

    python examples/particle_mesh.py

Expected output:
    grid: float32[32, 32, 32] sharded P('x', 'y', None); 4096 particles, 512 per device
    paint: mass conserved: True; equal to one device: True
    paint's collectives: collective-permute 4, all-gather 0
    potential at the particles: equal to one device: True
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import itertools  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import shardkit.fft as skfft  # noqa: E402
from shardkit.inspection.hlo import collective_counts  # noqa: E402

N = 32  # grid cells per side; cell i sits at position i (grid units), the box is periodic
M = 512  # particles per device
MESH = (2, 4)
CORNERS = list(itertools.product((0, 1), repeat=3))


def make_particles(seed=0):
    """Positions (2, 4, M, 3): block [i, j] lies in the domain of device (x=i, y=j)."""
    rng = np.random.default_rng(seed)
    lx, ly = N // MESH[0], N // MESH[1]
    pos = rng.uniform(0, 1, (*MESH, M, 3)) * [lx, ly, N]
    pos[..., 0] += np.arange(MESH[0])[:, None, None] * lx
    pos[..., 1] += np.arange(MESH[1])[None, :, None] * ly
    return pos.astype(np.float32)


def _cic(pos):
    """The 8 cells around each particle and their weights: [(offset, index, weight)]."""
    base = jnp.floor(pos)
    frac = pos - base
    out = []
    for c in CORNERS:
        w = jnp.prod(jnp.where(jnp.array(c) == 1, frac, 1 - frac), axis=-1)  # (M,)
        out.append((base.astype(jnp.int32) + jnp.array(c), w))
    return out


def _local(pos_blk):
    """Particle positions relative to this shard's padded block (one ghost cell each side)."""
    lx, ly = N // MESH[0], N // MESH[1]
    origin = jnp.stack([jax.lax.axis_index("x") * lx - 1, jax.lax.axis_index("y") * ly - 1, 0])
    return pos_blk.reshape(-1, 3) - origin.astype(pos_blk.dtype)  # (M, 3)


def paint(pos, mesh):
    """Cloud-in-cell density on the sharded grid, one unit of mass per particle."""
    lx, ly = N // MESH[0], N // MESH[1]

    def body(pos_blk):  # (1, 1, M, 3) -> padded block (lx + 2, ly + 2, N)
        grid = jnp.zeros((lx + 2, ly + 2, N), jnp.float32)
        for idx, w in _cic(_local(pos_blk)):
            grid = grid.at[idx[:, 0], idx[:, 1], idx[:, 2] % N].add(w)
        return grid

    padded = jax.shard_map(body, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y"))(pos)
    return skfft.halo_accumulate(padded, 1, spec=P("x", "y"))  # (N, N, N), P('x', 'y')


def read_out(field, pos, mesh):
    """Cloud-in-cell interpolation of a sharded field at each device's particles: (2, 4, M)."""
    padded = skfft.halo_exchange(field, 1, spec=P("x", "y"))

    def body(blk, pos_blk):  # (lx + 2, ly + 2, N), (1, 1, M, 3) -> (1, 1, M)
        vals = sum(w * blk[idx[:, 0], idx[:, 1], idx[:, 2] % N] for idx, w in _cic(_local(pos_blk)))
        return vals.reshape(1, 1, -1)

    spec = P("x", "y")
    return jax.shard_map(body, mesh=mesh, in_specs=(spec, spec), out_specs=spec)(padded, pos)


def potential(rho):
    """phi with laplacian(phi) = rho - mean(rho) on the periodic grid (grid units)."""
    rho_k = skfft.prfft3d(rho, spec=P("x", "y"))
    kx, ky, kz = skfft.fftfreq3d(rho_k, real=True, n=N, spec=P(None, ("x", "y"), None))
    k2 = (2 * jnp.pi) ** 2 * (kx**2 + ky**2 + kz**2)
    return skfft.pirfft3d(jnp.where(k2 > 0, -rho_k / jnp.where(k2 > 0, k2, 1), 0), n=N)


def one_device(pos):
    """The same paint, Poisson solve and read-out in numpy (float64) on one device."""
    flat = pos.reshape(-1, 3).astype(np.float64)
    base = np.floor(flat).astype(int)
    frac = flat - base
    rho = np.zeros((N, N, N))
    weights = []
    for c in CORNERS:
        w = np.prod(np.where(np.array(c) == 1, frac, 1 - frac), axis=-1)
        idx = (base + c) % N
        np.add.at(rho, (idx[:, 0], idx[:, 1], idx[:, 2]), w)
        weights.append((idx, w))
    k = np.fft.fftfreq(N)
    k2 = (2 * np.pi) ** 2 * (k[:, None, None] ** 2 + k[None, :, None] ** 2)
    k2 = k2 + (2 * np.pi * np.fft.rfftfreq(N)) ** 2
    rho_k = np.fft.rfftn(rho)
    phi = np.fft.irfftn(
        np.where(k2 > 0, -rho_k / np.where(k2 > 0, k2, 1), 0), s=(N, N, N), axes=(0, 1, 2)
    )
    vals = sum(w * phi[idx[:, 0], idx[:, 1], idx[:, 2]] for idx, w in weights)
    return rho, vals.reshape(*MESH, M)


def main():
    mesh = jax.make_mesh(MESH, ("x", "y"))
    host = make_particles()
    pos = jax.device_put(host, NamedSharding(mesh, P("x", "y")))
    step = jax.jit(lambda p: paint(p, mesh))
    rho = step(pos)
    rho_ref, vals_ref = one_device(host)
    spec = P(*(tuple(rho.sharding.spec) + (None,) * (3 - len(rho.sharding.spec))))
    n = host[..., 0].size
    print(f"grid: float32{list(rho.shape)} sharded {spec}; {n} particles, {M} per device")
    paint_err = float(np.max(np.abs(np.asarray(rho) - rho_ref)))
    mass = abs(float(jnp.sum(rho)) - n) < 1e-2
    print(f"paint: mass conserved: {mass}; equal to one device: {paint_err < 1e-5}")
    c = collective_counts(step.lower(pos).compile().as_text())
    cp, ag = c["collective-permute"], c["all-gather"]
    print(f"paint's collectives: collective-permute {cp}, all-gather {ag}")
    vals = jax.jit(lambda r, p: read_out(potential(r), p, mesh))(rho, pos)
    read_err = float(np.linalg.norm(np.asarray(vals) - vals_ref) / np.linalg.norm(vals_ref))
    print(f"potential at the particles: equal to one device: {read_err < 1e-5}")
    return {"paint_err": paint_err, "read_err": read_err, "rho": rho, "vals": vals}


if __name__ == "__main__":
    main()
