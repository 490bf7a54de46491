"""Tensor-parallel matmuls whose communication overlaps their compute (collective matmul).

Under sequence parallelism the residual stream (B, T, D) is split over the sequence along the
tensor axis; a column-parallel matmul first all-gathers it and a row-parallel one ends in a
reduce-scatter onto sequence slices. Done as written, each collective waits for (or holds up)
the whole matmul. `all_gather_matmul` and `matmul_reduce_scatter` cut them into P steps over
the tensor axis of size P (`shardkit.rings`): each device multiplies the sequence slice it
holds while the next slice travels to its neighbour, so the transfer of step s runs beside the
product of step s. The bytes are those of the all-gather and reduce-scatter they replace,
sent as P-1 collective-permutes; the backward pass, their transpose, is the mirrored ring.
This is Megatron's and torchtitan's "async TP" (Wang et al., 2023, "Overlap communication
with dependent computation via decomposition").

Inside `shardkit.placement.sequence_parallel(...)` without `collective_matmul` they are the
plain all-gather (`lax.all_gather`) and reduce-scatter (`lax.psum_scatter`) in a `shard_map`
on Auto axes: stating them fixes what the backward pass keeps (left to the compiler, under
gradient accumulation's `vmap` it kept the sequence slices and gathered them again), and on
Explicit axes `jnp.einsum` with sequence parallelism's layouts. Outside it they are
`jnp.einsum`, so a model calls them unconditionally. The Trainer enters the context for
`TensorParallel(sequence_parallel=True[, collective_matmul=True])` and the same `Hybrid`.

Example:
    >>> q = all_gather_matmul("btd,dhk->bthk", h, wq, split=1)  # doctest: +SKIP
    >>> y = matmul_reduce_scatter("bthk,hkd->btd", q, wo, split=0)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from shardkit.errors import ShardkitValueError
from shardkit.placement import constrain, gather_sequence, sequence_layout, sequence_out
from shardkit.rings import ring_gather, ring_reduce_scatter

__all__ = ["all_gather_matmul", "matmul_reduce_scatter"]


def _parse(eq: str, x: jax.Array, w: jax.Array, split: int, role: str):
    """(x's, w's and the output's subscripts) of a two-operand einsum `eq`, checked."""
    fix = f'fix: write the {role} matmul as e.g. "btd,df->btf" with x (batch, sequence, ...).'
    try:
        ins, out = eq.replace(" ", "").split("->")
        xs, ws = ins.split(",")
    except ValueError:
        raise ShardkitValueError(
            f"{role} matmul eq={eq!r} is not an explicit two-operand einsum; {fix}"
        ) from None
    if len(xs) != x.ndim or len(ws) != w.ndim or x.ndim < 2:
        raise ShardkitValueError(
            f"{role} matmul eq={eq!r} does not match x {tuple(x.shape)} and w "
            f"{tuple(w.shape)}; {fix}"
        )
    if not -w.ndim <= split < w.ndim:
        raise ShardkitValueError(
            f"{role} matmul split={split} is not a dim of w {tuple(w.shape)}; fix: the index "
            "of w's dim split over the tensor axis."
        )
    if xs[0] not in out or xs[1] not in out:
        raise ShardkitValueError(
            f"{role} matmul eq={eq!r} must keep x's batch {xs[0]!r} and sequence {xs[1]!r} "
            f"dims in its output; {fix}"
        )
    return xs, ws, out


def _spec(letters: str, axes: dict[str, Any]) -> P:
    return P(*(axes.get(c) for c in letters))


def _shard_map(body, lay, in_specs, out_spec, *operands):
    if lay.explicit:  # shard_map on Explicit axes takes its operands in the stated layouts
        operands = tuple(constrain(a, lay.mesh, s) for a, s in zip(operands, in_specs, strict=True))
    return jax.shard_map(
        body, mesh=lay.mesh, in_specs=in_specs, out_specs=out_spec, check_vma=False
    )(*operands)


def _size(lay) -> int:
    return int(dict(lay.mesh.shape)[lay.axis])


def _manual(lay) -> bool:
    """Whether the matmul runs in `shard_map` with its collectives stated: under collective
    matmul (the rings), and under plain sequence parallelism on Auto axes, where the
    compiler would otherwise choose what the backward pass keeps (under gradient
    accumulation's `vmap` it kept the sequence slices and gathered them again). On Explicit
    axes the types fix the layouts already (and JAX cannot batch a `psum_scatter` there)."""
    return lay is not None and (lay.collective_matmul or not lay.explicit)


def all_gather_matmul(eq: str, x: jax.Array, w: jax.Array, *, split: int) -> jax.Array:
    """A column-parallel matmul `jnp.einsum(eq, x, w)` of the residual stream.

    Args:
        eq: an einsum whose first operand is `x` (batch, sequence, ...) and whose output keeps
            both of those dims, e.g. "btd,df->btf" or "btd,cdhk->cbthk".
        x: the stream, split over the sequence under sequence parallelism.
        w: the weight, whose dim `split` (heads, MLP units) is split over the tensor axis.
        split: that dim of `w`; it must appear in the output.

    Returns:
        The product with the whole sequence and `w`'s split dim split over the tensor axis.
        Inside `sequence_parallel(..., collective_matmul=True)` the sequence slices travel
        around a ring while each one already here is multiplied; under plain sequence
        parallelism the sequence is all-gathered first; elsewhere it is `jnp.einsum(eq, x, w)`
        (with `gather_sequence(x)` on Explicit axes).

    Raises:
        ValueError: `eq` does not match the operands, or `w`'s split dim is not in the output.
    """
    xs, ws, out = _parse(eq, x, w, split, "column-parallel")
    if ws[split] not in out:
        raise ShardkitValueError(
            f"column-parallel matmul eq={eq!r}: w's split dim {ws[split]!r} is contracted; "
            "fix: split w on an output dim, or use matmul_reduce_scatter for a row-parallel one."
        )
    lay = sequence_layout(x)
    if not _manual(lay) or w.shape[split] % _size(lay):
        return jnp.einsum(eq, gather_sequence(x), w)
    p, t_out, lead = _size(lay), out.index(xs[1]), lay.spec[0]
    x_spec = _spec(xs, {xs[0]: lead, xs[1]: lay.axis})
    w_spec = _spec(ws, {ws[split]: lay.axis})
    out_spec = _spec(out, {xs[0]: lead, ws[split]: lay.axis})

    def body(x, w):  # x: this device's sequence slice
        if not lay.collective_matmul:
            return jnp.einsum(eq, lax.all_gather(x, lay.axis, axis=1, tiled=True), w)
        part = jax.eval_shape(lambda a, b: jnp.einsum(eq, a, b), x, w)
        whole = list(part.shape)
        whole[t_out] *= p

        def consume(acc, piece, start):  # piece: the slice starting at `start`
            return lax.dynamic_update_slice_in_dim(acc, jnp.einsum(eq, piece, w), start, t_out)

        return ring_gather(x, lay.axis, p, 1, consume, jnp.zeros(whole, part.dtype), False)

    return _shard_map(body, lay, (x_spec, w_spec), out_spec, x, w)


def matmul_reduce_scatter(
    eq: str, u: jax.Array, w: jax.Array, *, split: int, out_sharding: Any = None
) -> jax.Array:
    """A row-parallel matmul `jnp.einsum(eq, u, w)` back onto the residual stream.

    Args:
        eq: an einsum whose first operand is `u` (batch, sequence, ...) contracting `w`'s dim
            `split` with one of `u`'s, e.g. "btf,fd->btd" or "bthk,hkd->btd".
        u: the column-parallel side's output, its dim matching `w`'s `split` split over the
            tensor axis.
        w: the weight, split over the tensor axis on dim `split` (contracted).
        split: that dim of `w`.
        out_sharding: passed to `jnp.einsum` when the matmul runs as one (the layout an
            Explicit mesh asks for the reduced sums; under sequence parallelism it defaults
            to sequence slices).

    Returns:
        The summed product, split over the sequence under sequence parallelism: inside
        `sequence_parallel(..., collective_matmul=True)` partial sums travel around a ring
        and each device adds its part to the slice passing by; under plain sequence
        parallelism they are reduce-scattered after the product; elsewhere (and on Explicit
        axes) it is `jnp.einsum(eq, u, w, out_sharding=...)`.

    Raises:
        ValueError: `eq` does not match the operands, or `w`'s split dim is not contracted.
    """
    us, ws, out = _parse(eq, u, w, split, "row-parallel")
    if ws[split] in out or ws[split] not in us:
        raise ShardkitValueError(
            f"row-parallel matmul eq={eq!r}: w's split dim {ws[split]!r} must be contracted "
            "with one of u's; fix: split w on a contracted dim, or use all_gather_matmul."
        )
    lay = sequence_layout(u)
    p = _size(lay) if _manual(lay) else 0
    if not p or w.shape[split] % p or u.shape[1] % p:
        if out_sharding is None and lay is not None and out[:2] == us[:2]:
            out_sharding = sequence_out(u, len(out))  # Explicit axes: onto sequence slices
        return jnp.einsum(eq, u, w, out_sharding=out_sharding)
    lead = lay.spec[0]
    u_spec = _spec(us, {us[0]: lead, ws[split]: lay.axis})
    w_spec = _spec(ws, {ws[split]: lay.axis})
    out_spec = _spec(out, {us[0]: lead, us[1]: lay.axis})

    def body(u, w):  # u: this device's share of the contracted dim, whole sequence
        if not lay.collective_matmul:
            t_out = out.index(us[1])
            part = jnp.einsum(eq, u, w)
            return lax.psum_scatter(part, lay.axis, scatter_dimension=t_out, tiled=True)

        def contrib(start, length):  # this device's part of sequence slice start..+length
            return jnp.einsum(eq, lax.dynamic_slice_in_dim(u, start, length, 1), w)

        return ring_reduce_scatter(contrib, lay.axis, p, u.shape[1] // p, False)

    return _shard_map(body, lay, (u_spec, w_spec), out_spec, u, w)
