"""Transforms of traced values on Auto mesh axes, laid out by XLA's partitioner.

Inside `jax.jit` on Auto mesh axes a traced value carries no sharding: XLA's partitioner
chooses it when the program is compiled, after tracing. A transform called there without
`spec=` becomes one `jax.experimental.custom_partitioning` op (the complex transforms, the
pencil transposes, `batched_fftn`). Its sharding rule tells the partitioner how the input's
sharding moves to the output (the mesh axis of FFT dim i moves to dim i + 1 in the natural
layout); at compile time its partition callback receives the sharding the partitioner chose for
the input, validates it with the checks of the eager route, and lowers the same per-shard
program (`jax.shard_map`'s body) on each device. Each op is linear, differentiable in both
modes and batchable (`linear`).

A sharding rule maps dims through factors of equal size, but the sharding moves between dims of
different sizes (X to Y). Each moved dim is therefore written as a compound factor whose major
part is the greatest common divisor of the two sizes: a mesh axis that divides both (which the
all-to-all needs anyway) then shards that part on both sides.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_derivatives import linear_call
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.compat import is_vmap_mapped
from shardkit.errors import ShardkitValueError
from shardkit.fft import _dft as D
from shardkit.fft import _layout as L

# plan(mesh, entries) -> (per-shard body, in_spec, out_spec); raises ShardkitValueError when the
# input sharding `entries` does not suit the transform.
Plan = Callable[[Any, tuple], tuple[Callable, P, P]]


def applies(x: Any, spec: P | None) -> bool:
    """Whether `x`'s layout is left to XLA's partitioner: a traced value with no readable
    sharding and no `spec=`, on Auto mesh axes only (on Explicit ones the sharding is readable,
    so none means replicated; `jax.shard_map`'s Manual axes have no partitioner)."""
    if spec is not None or not isinstance(x, jax.core.Tracer) or L.spec_of(x) is not None:
        return False
    meshes = (jax.sharding.get_abstract_mesh(), jax.typeof(x).sharding.mesh)
    types = {t for m in meshes for t in tuple(getattr(m, "axis_types", ()))}
    return not types & {AxisType.Manual, AxisType.Explicit}


def moved_rule(in_shape: tuple, out_shape: tuple, moves: dict[int, int]) -> tuple[str, dict]:
    """A sharding rule in which input dim i's sharding moves to output dim `moves[i]`.

    Dims not in `moves` (or `moves` values) are batch dims passed through when they are leading
    (`...`), else free factors. Returns the rule string and the sizes of the factors that only
    occur inside compound factors.
    """
    sizes: dict[str, int] = {}
    whole: set[str] = set()

    def factor(parts: list[tuple[str, int]]) -> str:
        kept = [(n, s) for n, s in parts if s > 1] or parts[:1]
        if len(kept) == 1:
            whole.add(kept[0][0])
            return kept[0][0]
        sizes.update(kept)
        return "(" + " ".join(n for n, _ in kept) + ")"

    nb = min([*moves, *moves.values()])
    ins = [f"i{d}" for d in range(nb, len(in_shape))]
    outs = [f"o{d}" for d in range(nb, len(out_shape))]
    for d, e in moves.items():
        g = math.gcd(in_shape[d], out_shape[e])
        ins[d - nb] = factor([(f"g{d}", g), (f"i{d}", in_shape[d] // g)])
        outs[e - nb] = factor([(f"g{d}", g), (f"o{e}", out_shape[e] // g)])
    rule = "... " + " ".join(ins) + " -> ... " + " ".join(outs)
    return rule, {n: s for n, s in sizes.items() if n not in whole}


def kept_rule(ndim: int, whole: tuple[int, ...]) -> tuple[str, dict]:
    """A sharding rule in which every dim keeps its sharding and the dims `whole` stay whole."""
    factors = " ".join(f"d{d}" for d in range(ndim))
    return f"{factors} -> {factors}", {"need_replication_factors": tuple(f"d{d}" for d in whole)}


# The norm whose transform in the other direction scales as `norm` does in this one (`conjugated`).
ADJOINT_NORM = {None: "forward", "backward": "forward", "ortho": "ortho", "forward": "backward"}


def fft(a: jax.Array, axes: tuple[int, ...], norm: str | None, inverse: bool) -> jax.Array:
    """`jnp.fft.fftn` (or `ifftn`) on one device, its scale a Python number: a custom op's
    reference may hold no array constants, which `jnp.fft`'s `norm=` makes in some versions."""
    n = math.prod(a.shape[d] for d in axes)
    if inverse:  # ifftn divides by n already
        return jnp.fft.ifftn(a, axes=axes) * float(n * D.norm_factor(norm, n, inverse=True))
    return jnp.fft.fftn(a, axes=axes) * float(D.norm_factor(norm, n, inverse=False))


def conjugated(other: Callable) -> Callable:
    """`ct -> conj(other(conj(ct)))`: the VJP of a transform whose adjoint is `other` (the
    transform the other way, with norm `ADJOINT_NORM[norm]`), since a DFT's matrix is
    symmetric."""
    return lambda ct: jnp.conj(other(jnp.conj(ct)))


def op(
    *,
    plan: Plan,
    reference: Callable[[jax.Array], jax.Array],
    rule: tuple[str, dict],
    fname: str,
    cotangent: bool = False,
) -> Callable[[jax.Array], jax.Array]:
    """A transform as a custom-partitioned op (see the module docstring), jitted.

    Args:
        plan: builds the per-shard program from the mesh and the input's PartitionSpec entries.
        reference: the transform on one device (lowered when the program has one device).
        rule: the sharding rule and its keyword arguments (`moved_rule`, `kept_rule`).
        fname: the public function's name, for errors.
        cotangent: the op is a VJP, applied to a cotangent the user never sees: when the
            partitioner gives it a sharding the transform cannot use (e.g. replicated, for the
            loss `sum(real(y) * w)` with `w` replicated), the op picks one it can use
            (`_usable`), slicing its block from the cotangent's or having it resharded,
            instead of raising.

    Returns:
        The op. It is jitted, so that called on a concrete array (under `jax.grad` without
        `jit`) it is partitioned too: outside `jit` the op would run `reference` as plain JAX
        ops, which gather a sharded operand.
    """
    custom = custom_partitioning(reference)

    def partition(mesh, arg_shapes, result_shape):
        del result_shape  # the output's sharding follows from the input's
        arg = arg_shapes[0]
        mesh, entries = _named(mesh, arg, fname)
        try:
            body, in_spec, out_spec = plan(mesh, entries)
        except ShardkitValueError as e:
            usable = _usable(plan, mesh, entries) if cotangent else None
            if usable is None:
                raise ShardkitValueError(
                    f"{e} (Inside jit on Auto mesh axes, XLA's partitioner chose this sharding, "
                    f"{P(*entries)}, for x; to choose another, constrain x first with "
                    f"jax.lax.with_sharding_constraint(x, P(...)), or pass spec=.)"
                ) from None
            body, in_spec, out_spec = usable
        out = (NamedSharding(mesh, in_spec),)  # the partitioner reshards x to it if need be
        return mesh, body, NamedSharding(mesh, out_spec), out

    text, sizes = rule
    custom.def_partition(partition=partition, sharding_rule=text, **sizes)
    return jax.jit(custom)


def _named(mesh: Any, arg: Any, fname: str) -> tuple[Any, tuple]:
    """The mesh and PartitionSpec entries of the sharding the partitioner gave the operand.

    JAX names the sharding on the mesh it lowers with, taken from the jitted function's
    arguments. When none carries one (e.g. a function of no arguments under `jax.set_mesh`) the
    sharding comes without a mesh; it is then matched against the specs of `jax.set_mesh`'s mesh
    where the compiler's callback sees it (JAX 0.12; JAX 0.10 compiles outside that context).
    """
    ndim = len(arg.shape)
    if isinstance(arg.sharding, NamedSharding):
        return mesh, L.normalize(arg.sharding.spec, ndim)
    context = jax.sharding.get_mesh()
    if getattr(context, "devices", None) is not None and context.size == len(
        arg.sharding.device_set
    ):
        for entries in _specs(tuple(context.axis_names), ndim):
            if NamedSharding(context, P(*entries)).is_equivalent_to(arg.sharding, ndim):
                return context, entries
    raise ShardkitValueError(
        f"{fname}: inside jit, XLA's partitioner gave x (shape {tuple(arg.shape)}) a sharding "
        f"that names no mesh ({arg.sharding}): no argument of the jitted function carries one; "
        f"fix: pass spec= (and mesh= outside jax.set_mesh), or pass the jitted function an "
        f"array sharded on the mesh."
    )


def _usable(plan: Plan, mesh: Any, given: tuple) -> tuple[Callable, P, P] | None:
    """A plan for a sharding the transform can use, or None when there is none.

    Only shardings that use every mesh axis of size > 1 can be usable (a plan refuses an idle
    axis). Preferred is one whose shards are slices of the `given` operand's shards (each dim's
    mesh axes extend the given ones, e.g. a replicated cotangent): the returned body takes the
    operand as given and slices its block locally, so nothing is resharded. Otherwise the one
    that keeps most given entries, which the partitioner reshards the operand to.
    """
    shape = dict(mesh.shape)
    names = tuple(n for n, size in shape.items() if size > 1)
    best, best_rank = None, (-1, -1)
    for entries in _specs(names, len(given), used=len(names)):
        try:
            body, in_spec, out_spec = plan(mesh, entries)
        except ShardkitValueError:
            continue
        sliceable = all(
            L.entry_names(e)[: len(L.entry_names(g))] == L.entry_names(g)
            for e, g in zip(entries, given, strict=True)
        )
        rank = (int(sliceable), sum(e == g for e, g in zip(entries, given, strict=True)))
        if rank > best_rank:
            if sliceable:
                body, in_spec = _sliced(body, entries, given, shape), P(*given)
            best, best_rank = (body, in_spec, out_spec), rank
    return best


def _sliced(body: Callable, entries: tuple, given: tuple, mesh_shape: dict) -> Callable:
    """`body`, which takes a block sharded `entries`, run on a block sharded `given` (each
    dim's mesh axes a prefix of those in `entries`): it first slices its own block out."""

    def run(blk):
        starts, sizes = [], []
        for d, (e, g) in enumerate(zip(entries, given, strict=True)):
            extra = L.entry_names(e)[len(L.entry_names(g)) :]
            size = blk.shape[d] // L.entry_size(extra, mesh_shape)
            starts.append(jax.lax.axis_index(extra) * size if extra else 0)
            sizes.append(size)
        return body(jax.lax.dynamic_slice(blk, starts, sizes))

    return run


def _specs(names: tuple[str, ...], ndim: int, used: int | None = None):
    """Every PartitionSpec (as entries) of `ndim` dims over mesh axes `names`, fewest axes first
    (or those that use `used` axes)."""
    counts = range(len(names) + 1) if used is None else (used,)
    for n_axes in counts:
        for axes in itertools.permutations(names, n_axes):
            for dims in itertools.product(range(ndim), repeat=n_axes):
                entries: list[list[str]] = [[] for _ in range(ndim)]
                for a, d in zip(axes, dims, strict=True):
                    entries[d].append(a)
                yield L.normalize(P(*(tuple(e) or None for e in entries)), ndim)


def linear(
    op: Callable, adjoint: Callable[[], Callable], batched: Callable[[tuple], Callable]
) -> Callable:
    """`op`, a linear map, made differentiable in both modes, transposable and batchable; its
    transpose is `adjoint()`.

    A custom-partitioned op has no JVP, transpose or batching rule of its own, so:

    - it runs through `jax.custom_derivatives.linear_call`, whose transpose is `adjoint()`:
      `jax.linear_transpose` and reverse mode (`jax.grad`, `jax.vjp`) take it. `adjoint` is
      called only then, so two ops can be each other's adjoint;
    - its JVP applies it to the tangent (`jax.jvp`, `jax.jacfwd`); the rule is itself
      differentiable (second order);
    - a mapped operand (a tangent mapped by `jax.vmap` where the primal is not, or the op
      called on a mapped value) takes a `jax.custom_batching.custom_vmap` rule, which runs
      `batched(shape)`, the op for the whole batch of `shape` (the mapped dim first, one more
      leading batch dim); `linear_call` has no batching rule, so a mapped operand takes the op
      directly. Derivatives whose primal is mapped (`jax.vmap(jax.grad(f))`) never reach the
      op: the transform runs them on the whole batch first (`_vmap.call_differentiated`).
    """

    @jax.custom_batching.custom_vmap
    def mapped(a):
        return op(a)

    @mapped.def_vmap
    def _rule(axis_size, in_batched, a):
        del axis_size, in_batched  # one operand, mapped (else the rule would not run)
        return batched(tuple(a.shape))(a), True

    @jax.custom_jvp
    def differentiable(a):
        if is_vmap_mapped(a):
            return mapped(a)
        return linear_call(lambda _, v: mapped(v), lambda _, ct: adjoint()(ct), None, a)

    @differentiable.defjvp
    def _jvp(primals, tangents):  # itself differentiable: higher orders call it again
        (a,), (t,) = primals, tangents
        return differentiable(a), differentiable(t)

    return differentiable
