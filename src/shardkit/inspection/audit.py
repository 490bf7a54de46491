"""`inspect`: compile a function and audit what the compiler did.

The audit reads the compiled program (`compiled.as_text()`), not the user's code, so it sees
every collective the SPMD partitioner inserted, including the silent ones: an all-gather of a
whole sharded operand under `jnp.fft.fftn` or `jnp.linalg.solve`, a resharding between two
layouts, a gradient all-reduce. For each it finds the kind, bytes, mesh axes (by decoding the
replica groups against the mesh), how often it runs (loop trip counts) and the user's source
line (through the stack-frame tables XLA keeps in the text).

Example (with `jax`, `jnp`, `shardkit`, `AxisType`, `NamedSharding`, `P` imported, on 8
devices):
    >>> mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    >>> x = jax.ShapeDtypeStruct((1024, 512), jnp.float32,
    ...                          sharding=NamedSharding(mesh, P("data", "model")))
    >>> report = shardkit.inspect(jnp.fft.fftn, x)
    >>> for c in report.of_kind("all-gather"):
    ...     print(c.describe())
    all-gather c64[256,256] -> c64[256,512] over model (n=2): 512.0 KiB per device x 1 at ...
    all-gather c64[256,512] -> c64[1024,512] over data (n=4): 3.0 MiB per device x 1 at ...
"""

from __future__ import annotations

import inspect as pyinspect
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from shardkit.collectives import FORMULAS, bytes_moved
from shardkit.errors import ShardkitError, ShardkitValueError
from shardkit.inspection import groups as groups_mod
from shardkit.inspection import hlo
from shardkit.inspection.compiled_layout import input_pairs, layout_for
from shardkit.inspection.compiling import compile_for
from shardkit.inspection.options import check_byte_bound, check_options
from shardkit.inspection.report import Collective, Cost, Finding, MemoryStats, Report
from shardkit.mesh import describe_mesh

DEFAULT_LARGE_BYTES = 256 * 2**20
_NARROW = ("bf16", "f16", "f8")


class NoMeshError(ShardkitError, ValueError):
    """The program has no mesh to decode its collectives against."""


def _program_mesh(compiled: Any) -> Any:
    """The mesh of the program's NamedShardings (its arguments', else its outputs'), if any."""
    import jax
    from jax.sharding import NamedSharding

    in_sh, out_sh = compiled.input_shardings, compiled.output_shardings
    for sh in jax.tree.leaves((in_sh, out_sh)):
        if isinstance(sh, NamedSharding) and sh.mesh.size > 1:
            return sh.mesh
    return None


def _device_ids(mesh: Any) -> list[int] | None:
    """The device ids of a concrete mesh in row-major order; None for an AbstractMesh."""
    import jax

    if not isinstance(mesh, jax.sharding.Mesh):
        return None
    return [int(d.id) for d in mesh.devices.flat]


def _find_mesh(compiled: Any, mesh: Any) -> Any:
    """The mesh to decode against: `mesh`, else the program's, else `jax.set_mesh`'s; None
    when there is none."""
    import jax

    if mesh is not None:
        return mesh
    own = _program_mesh(compiled)
    if own is not None:
        return own
    abstract = jax.sharding.get_abstract_mesh()
    if not abstract.empty:
        return abstract
    return None


def _check_same_mesh(mesh: Any, own: Any) -> None:
    """Raises unless `mesh` has the axes (names, sizes, order) and device order of `own`."""
    ids, own_ids = _device_ids(mesh), _device_ids(own)
    same_axes = _mesh_axes(mesh) == _mesh_axes(own)
    if same_axes and (None in (ids, own_ids) or ids == own_ids):  # an AbstractMesh: no devices
        return
    order = ""
    if same_axes:
        order = f" (the same mesh axes, but devices in the order {ids} instead of {own_ids})"
    raise ShardkitValueError(
        f"inspect(mesh=...): mesh={describe_mesh(mesh)} is not the mesh the arguments are "
        f"placed on, {describe_mesh(own)}{order}. The compiled program numbers the devices of "
        "the arguments' mesh, so its replica groups decoded against another mesh would name "
        "the wrong mesh axes; fix: drop mesh= (the arguments' mesh is used), or pass mesh= "
        "the mesh the arguments are placed on (x.sharding.mesh)."
    )


def _mesh_axes(mesh: Any) -> tuple[tuple[str, ...], tuple[int, ...]]:
    shape = dict(mesh.shape)
    names = tuple(mesh.axis_names)
    return names, tuple(int(shape[n]) for n in names)


_LAYOUT_ONLY = ("copy", "bitcast", "transpose")  # ops that move a cast's values unchanged


def _upcast_source(module: hlo.HloModule, instr: hlo.Instruction) -> str | None:
    """The narrow dtype an operand was converted from just before the collective, if any."""
    for name in instr.operands:
        op = module.symbol(instr.computation, name)
        if op is None:
            continue
        src = None
        if op.opcode == "convert" and op.operands:
            src = module.symbol(op.computation, op.operands[0])
        elif op.opcode == "fusion":
            callee = op.attr("calls")
            body = module.computations.get(callee.lstrip("%")) if callee else None
            root = next((i for i in reversed(body or []) if i.is_root), None)
            while root is not None and root.opcode in _LAYOUT_ONLY and root.operands:
                root = module.symbol(root.computation, root.operands[0])  # a copy of the cast
            if root is not None and root.opcode == "convert" and root.operands:
                src = module.symbol(root.computation, root.operands[0])
        if src is not None and src.arrays:
            dt = src.arrays[0].dtype
            if dt.startswith(_NARROW) and op.arrays and op.arrays[0].dtype not in _NARROW:
                return dt
    return None


def _bytes(kind: str, operand_bytes: int, n: int) -> tuple[int, float]:
    """(buffer bytes the formula applies to, bytes each device sends per execution)."""
    buf = operand_bytes * n if kind == "all-gather" else operand_bytes
    return buf, bytes_moved(kind, buf, n) if kind in FORMULAS else float(operand_bytes)


def collectives_of(
    module: hlo.HloModule,
    mesh_names: tuple[str, ...],
    mesh_sizes: tuple[int, ...],
    *,
    branch_counts: Mapping[str, Sequence[int]] | None = None,
    fallback: hlo.SourceFrame | None = None,
) -> tuple[Collective, ...]:
    """Every collective of a parsed program, decoded against a mesh (names and sizes).

    `branch_counts` weights the branches of named conditionals (see
    `shardkit.inspection.hlo.execution_counts`); without it every branch counts as taken.
    `fallback` is the source of a collective whose traceback holds no frame of the user's.
    """
    counts = hlo.execution_counts(module, branch_counts)
    out = []
    for ins in module.collectives():
        kind = ins.kind
        assert kind is not None
        groups = groups_mod.replica_groups(ins, module.num_partitions)
        axes, partial = groups_mod.mesh_axes_of(
            groups, mesh_names, mesh_sizes, pairs=kind == "collective-permute"
        )
        if kind == "collective-permute":
            # the ring (or chain) runs along the mesh axes the pairs move over
            span = {i for g in groups for i in g}
            n = math.prod(mesh_sizes[mesh_names.index(a)] for a in axes) if axes else len(span)
        else:
            n = len(groups[0]) if groups else 1
        op_shapes = []
        for name in ins.operands:
            op = module.symbol(ins.computation, name)
            if op is not None:
                op_shapes.extend(op.arrays)
        results = ins.arrays
        if ins.opcode.endswith("-start") and op_shapes:
            # async start: the result tuple holds operands and outputs; keep the outputs
            results = results[len(op_shapes) : 2 * len(op_shapes)] or results
        res_bytes = sum(a.nbytes for a in results)
        op_bytes = sum(a.nbytes for a in op_shapes)
        if not op_shapes:  # operands not defined in the text: infer their size from the result
            op_bytes = {"all-gather": res_bytes // n, "reduce-scatter": res_bytes * n}.get(
                kind, res_bytes
            )
        buf, moved = _bytes(kind, op_bytes, n)
        tb = hlo.source_of(module, ins)
        dtype = (op_shapes or list(results) or [hlo.ArrayShape("?", ())])[0].dtype
        out.append(
            Collective(
                kind=kind,
                name=ins.name,
                dtype=dtype,
                shapes=tuple(str(a) for a in (op_shapes or results)),
                result_shapes=tuple(str(a) for a in results),
                buffer_bytes=int(buf),
                bytes_moved=moved,
                group_size=n,
                num_groups=len(groups),
                axes=axes,
                partial=partial,
                count=counts.get(ins.computation),
                source=hlo.user_frame(tb) or fallback,
                traceback=tb,
                op_name=ins.op_name,
                upcast_from=_upcast_source(module, ins),
                computation=ins.computation,
            )
        )
    return tuple(out)


def _definition(fn: Any) -> hlo.SourceFrame | None:
    """Where `fn` is defined: the source of collectives no user frame explains (a library
    function audited on its own, e.g. `shardkit inspect jax.numpy.fft:fftn`)."""
    code = getattr(pyinspect.unwrap(getattr(fn, "__wrapped__", fn)), "__code__", None)
    if code is None:
        return None
    return hlo.SourceFrame(file=code.co_filename, line=code.co_firstlineno, function=code.co_name)


def _memory(compiled: Any) -> MemoryStats | None:
    try:
        m = compiled.memory_analysis()
    except Exception:  # backends without memory analysis  # noqa: BLE001
        return None
    if m is None:
        return None
    return MemoryStats(
        argument_bytes=int(m.argument_size_in_bytes),
        output_bytes=int(m.output_size_in_bytes),
        alias_bytes=int(m.alias_size_in_bytes),
        temp_bytes=int(m.temp_size_in_bytes),
        generated_code_bytes=int(m.generated_code_size_in_bytes),
    )


def _cost(compiled: Any) -> Cost:
    try:
        c = compiled.cost_analysis()
    except Exception:  # noqa: BLE001
        c = None
    if isinstance(c, list | tuple):
        c = c[0] if c else None
    c = c or {}
    return Cost(
        flops=c.get("flops"),
        bytes_accessed=c.get("bytes accessed"),
        transcendentals=c.get("transcendentals"),
    )


_GATHER_LIKE = ("dynamic-update-slice", "pad")  # a device's block written into a zero buffer
_PASS_THROUGH = (*_LAYOUT_ONLY, "convert", "reshape")


def _producer(module: hlo.HloModule, ins: hlo.Instruction | None) -> hlo.Instruction | None:
    """The instruction that computes `ins`'s values: through copies, casts and reshapes, and
    into a fusion's root."""
    for _ in range(64):  # a chain of pass-through ops; HLO has no cycles, the bound is a guard
        if ins is None:
            return None
        if ins.opcode == "fusion":
            callee = ins.attr("calls")
            body = module.computations.get(callee.lstrip("%")) if callee else None
            ins = next((i for i in reversed(body or []) if i.is_root), None)
        elif ins.opcode in _PASS_THROUGH and ins.operands:
            ins = module.symbol(ins.computation, ins.operands[0])
        else:
            return ins
    return ins


def _materialises(module: hlo.HloModule, c: Collective) -> bool:
    """Whether `c` assembles an array from every device's block: an all-gather, or an all-reduce
    of a zero buffer with this device's block written in (XLA's spelling of a gather as a sum).
    An all-reduce of computed values (a gradient, a partial sum) assembles nothing."""
    if c.kind == "all-gather":
        return True
    ins = module.symbol(c.computation, c.name) if c.kind == "all-reduce" else None
    for name in ins.operands if ins is not None else ():
        op = _producer(module, module.symbol(ins.computation, name))
        if op is not None and op.opcode in _GATHER_LIKE:
            return True
    return False


def _implicit_gather(
    module: hlo.HloModule, c: Collective, i: int, sharded_inputs: list[tuple[tuple, int]]
) -> Finding | None:
    """The `implicit-gather` warning for `c`: it assembles a whole sharded input on every
    device (its result has that input's element count), so the operation is not partitioned."""
    if c.group_size <= 1 or not c.result_shapes or not _materialises(module, c):
        return None
    res = hlo.parse_shape(c.result_shapes[0])
    elems = math.prod(res[0].dims) if res else 0
    match = next((s for s, n in sharded_inputs if n == elems), None)
    if match is None:
        return None
    return Finding(
        "implicit-gather",
        f"{c.kind} #{i} materialises a whole sharded operand ({c.result_shapes[0]}, global "
        f"shape {list(match)}) on every device at {c.where}. The operation is not "
        "partitioned: each device computes on the full array; fix: use a distributed "
        "algorithm (shard_map with explicit collectives, e.g. shardkit.fft / shardkit.linalg) "
        "or reshard so no operand needs gathering.",
        i,
    )


def _replicated_outputs(compiled: Any, replicated_inputs: set[tuple]) -> list[Finding]:
    """`replicated-output` warnings: outputs every device holds whole, unless shaped like a
    replicated input (data-parallel parameters come back replicated on purpose)."""
    import jax

    found = []
    flat_out, treedef = jax.tree_util.tree_flatten_with_path(compiled.out_info)
    for (path, info), sh in zip(
        flat_out, treedef.flatten_up_to(compiled.output_shardings), strict=True
    ):
        if (
            getattr(sh, "is_fully_replicated", False)
            and math.prod(info.shape) > 1
            and (tuple(info.shape), str(info.dtype)) not in replicated_inputs
        ):
            name = "out" + jax.tree_util.keystr(path)
            found.append(
                Finding(
                    "replicated-output",
                    f"output {name} {info.dtype}{list(info.shape)} is fully replicated "
                    "although an input is sharded: every device holds the whole result; "
                    "fix: jax.jit(f, out_shardings=NamedSharding(mesh, P(...))) or "
                    "jax.lax.with_sharding_constraint on the result.",
                )
            )
    return found


def _findings(
    compiled: Any,
    module: hlo.HloModule,
    colls: tuple[Collective, ...],
    large_bytes: float,
    platform: str,
) -> tuple[Finding, ...]:
    found: list[Finding] = []
    pairs = [(info, sh) for _, info, sh in input_pairs(compiled) if sh is not None]  # used ones
    sharded_inputs = [
        (tuple(info.shape), math.prod(info.shape))
        for info, sh in pairs
        if not getattr(sh, "is_fully_replicated", True) and math.prod(info.shape) > 1
    ]
    # replicated inputs that may come back replicated (e.g. data-parallel parameters)
    replicated_inputs = {
        (tuple(info.shape), str(info.dtype))
        for info, sh in pairs
        if getattr(sh, "is_fully_replicated", False)
    }
    for i, c in enumerate(colls):
        gather = _implicit_gather(module, c, i, sharded_inputs)
        if gather is not None:
            found.append(gather)
        if c.total_bytes > large_bytes:
            found.append(
                Finding(
                    "large-collective",
                    f"{c.kind} #{i} moves {c.total_bytes:,.0f} bytes per device per call "
                    f"(> {large_bytes:,.0f}) at {c.where}; fix: check the layouts of its "
                    "operands, or raise large_bytes=.",
                    i,
                )
            )
        if c.upcast_from:
            backend = "XLA:CPU" if platform == "cpu" else f"XLA:{platform.upper()}"
            found.append(
                Finding(
                    "upcast",
                    f"{c.kind} #{i} runs in {c.dtype} on {c.upcast_from} data ({backend} "
                    f"converts {c.upcast_from} collectives to {c.dtype}, so its bytes are "
                    "counted in the wider type; GPU and TPU keep the narrow type) at "
                    f"{c.where}.",
                    i,
                )
            )
    if sharded_inputs:
        found.extend(_replicated_outputs(compiled, replicated_inputs))
    return tuple(found)


def inspect(
    fn: Any,
    *args: Any,
    mesh: Any = None,
    large_bytes: float = DEFAULT_LARGE_BYTES,
    branch_counts: Mapping[str, Sequence[int]] | None = None,
    **kwargs: Any,
) -> Report:
    """Compiles `fn` for `args` and reports what the compiler did.

    The report lists every collective of the compiled program (kind, dtype and shape, bytes
    per device, mesh axes, executions per call, the user's source line), per-device memory
    from `memory_analysis()`, FLOPs and bytes accessed from `cost_analysis()`, warnings, and
    the input/output layouts.

    Args:
        fn: a function, a `jax.jit`-wrapped function, a `Lowered` or a `Compiled` object.
        *args: the arguments to compile for: arrays or `jax.ShapeDtypeStruct`s with shardings
            (none for a Lowered or Compiled object).
        mesh: the mesh to decode collectives against; default: the mesh of the program's
            `NamedSharding`s, else the one set with `jax.set_mesh`. When the program has
            NamedShardings, `mesh` must be their mesh (same mesh axes and device order).
        large_bytes: collectives moving more bytes per device per call get a warning.
        branch_counts: how often each branch of a data-dependent conditional runs, for
            collectives inside `lax.switch` branches: conditional key (its instruction name or
            an `op_name` component such as a `jax.named_scope`) -> executions per branch; see
            `shardkit.inspection.hlo.execution_counts`. Default: every branch counts as taken.
        **kwargs: keyword arguments for `fn` (any name but `mesh`, `large_bytes` and
            `branch_counts`).

    Returns:
        A `Report` (print it, or use `.to_dict()`, `.to_json()`, `.to_html()`).

    Raises:
        TypeError: `fn` is not callable, or the arguments do not match its signature.
        NoMeshError: the program has no mesh (no NamedSharding anywhere, no `jax.set_mesh`).
        ValueError: `mesh` is not the mesh the arguments are placed on (other mesh axes or
            sizes, or another device order); a `branch_counts` key names no conditional, or
            has the wrong length.

    Example:
        >>> mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
        >>> a = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("x")))
        >>> report = shardkit.inspect(lambda a: a @ a.T, a)
        >>> report.counts()["all-gather"]
        1

    See also:
        `shardkit.assert_collectives`, `shardkit.inspection.compiled_layout`.
    """
    check_byte_bound(large_bytes, "large_bytes", "inspect")
    given = {"mesh": mesh, "branch_counts": branch_counts}
    if large_bytes != DEFAULT_LARGE_BYTES:
        given["large_bytes"] = large_bytes
    check_options(fn, args, kwargs, given)
    compilation = compile_for(fn, args, kwargs)
    compiled = compilation.compiled
    found = _find_mesh(compiled, mesh)
    t0 = time.perf_counter()
    text = compiled.as_text()
    module = hlo.parse_hlo(text)
    parse_text = time.perf_counter() - t0
    if found is None:
        what = getattr(fn, "__name__", type(fn).__name__)
        raise NoMeshError(
            f"inspect({what}, ...): the compiled program ({module.num_partitions} partition(s)) "
            "has no mesh: no argument or output carries a NamedSharding and no mesh is set; "
            "fix: place the arguments with jax.device_put(x, NamedSharding(mesh, P(...))) or "
            "pass jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P(...))), "
            "or call inside `with jax.set_mesh(mesh):`, or pass mesh=."
        )
    names, sizes = _mesh_axes(found)
    if math.prod(sizes) != module.num_partitions:
        raise NoMeshError(
            f"inspect: the mesh {dict(zip(names, sizes, strict=True))} has {math.prod(sizes)} "
            f"devices but the program runs on {module.num_partitions} partitions; fix: pass "
            "mesh= the mesh the program was compiled for."
        )
    own = _program_mesh(compiled)
    if mesh is not None and own is not None:
        _check_same_mesh(mesh, own)
    t1 = time.perf_counter()
    colls = collectives_of(
        module, names, sizes, branch_counts=branch_counts, fallback=_definition(fn)
    )
    platform = _platform(compiled)
    findings = _findings(compiled, module, colls, large_bytes, platform)
    parse_seconds = parse_text + time.perf_counter() - t1
    return Report(
        name=module.name,
        mesh=dict(zip(names, sizes, strict=True)),
        platform=platform,
        collectives=colls,
        memory=_memory(compiled),
        cost=_cost(compiled),
        warnings=findings,
        layout=layout_for(compilation, fn, args, kwargs),
        parse_seconds=parse_seconds,
        compile_seconds=compilation.seconds,
    )


def _platform(compiled: Any) -> str:
    try:
        devs = compiled.runtime_executable().local_devices()
        return devs[0].platform if devs else "?"
    except Exception:  # noqa: BLE001
        import jax

        return jax.default_backend()
