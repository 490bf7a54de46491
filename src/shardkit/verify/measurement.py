"""Measure a training step by compiling it: memory, collectives and FLOPs per device.

The planner predicts; this module asks the compiler. It compiles a step for a target mesh
without allocating anything (parameters, optimizer state and batch are
`jax.ShapeDtypeStruct`s) and reads the compiled program through `shardkit.inspect`:

- up to the process's device count, on a real (simulated) mesh;
- beyond it (256 to 16,384 devices and more), on an `AbstractMesh`: the step is traced under
  `jax.sharding.use_abstract_mesh`, lowered for "cpu" and compiled with one CPU device
  repeated as the device assignment. XLA partitions the program for every device of the mesh;
  nothing runs.

XLA:CPU is not the GPU/TPU backend, so two of its habits are normalised (both kept visible in
`Measurement.notes` and in the raw figures):

1. it runs bf16 collectives in f32: a collective whose operand was converted from bf16 just
   before it, whose reduction XLA "promoted" from bf16, or whose result is cast to bf16 by
   every user (the cast sunk below the collective), is counted at 2 bytes per element;
2. it reduces gradients of parameters split over the ZeRO mesh axis with an all-reduce followed
   by a slice where GPUs and TPUs emit a reduce-scatter: such an all-reduce (over a group that
   includes the ZeRO axis, in the backward pass or read only through a slice, as the
   reduction of accumulated ZeRO-1 gradients after the micro-batch loop is) is counted as the
   reduce-scatter over that axis plus an all-reduce of the shard over the group's other axes.

A pipelined step scans the executor's step table with one `lax.switch` per lane; collectives
inside a branch (the tensor all-reduces of a forward or backward) run as often as the table
takes that branch, not at every step. `measure_gpt` passes the table's counts
(`shardkit.pipeline.engine.branch_counts`) to the audit as `branch_counts`, for the busiest
device: the last stage, whose ops are the other stages' plus the loss head (every device runs
the same number of ops of each kind per lane; only the last stage's carry the head).

Example:
    >>> from shardkit.models import GPTConfig
    >>> from shardkit.strategies import Hybrid
    >>> m = measure_gpt(GPTConfig(vocab=64, d_model=64, n_layers=2, n_heads=4, seq_len=16),
    ...                 Hybrid(fsdp=32, tensor=8), devices=256, batch=64)
    >>> m.abstract, m.mesh
    (True, {'fsdp': 32, 'tensor': 8})
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.collectives import bytes_moved
from shardkit.errors import ShardkitValueError
from shardkit.inspection import inspect
from shardkit.inspection.audit import collectives_of
from shardkit.inspection.hlo import execution_counts, parse_hlo
from shardkit.inspection.report import Report
from shardkit.models import GPT, lm_loss
from shardkit.pipeline import table
from shardkit.pipeline.engine import LANE_SCOPE, branch_counts
from shardkit.train.trainer import Trainer

_NARROW_BYTES = {"bf16": 2, "f16": 2}
_WIDE_BYTES = {"f32": 4, "f64": 8}


@dataclasses.dataclass(frozen=True)
class Measurement:
    """What the compiler says about one step, per device.

    Attributes:
        mesh: mesh axis name -> size.
        abstract: True when compiled on an `AbstractMesh` (more devices than present).
        argument_bytes: parameters, optimizer state and batch held between steps.
        output_bytes: outputs (the new state aliases the donated one).
        alias_bytes: output bytes that reuse donated argument buffers.
        temp_bytes: temporaries (activations, gathered weights, gradients in flight).
        flops: matmul FLOPs of the compiled program, loop bodies times their trip counts
            (`matmul_flops`; elementwise work is not counted).
        xla_flops: `cost_analysis()["flops"]`, which counts each loop body once (None when
            the backend gives none).
        collectives: kind -> {"count", "bytes" (normalised), "raw_bytes" (as compiled)};
            bytes each device sends per step, ring formulas (`shardkit.inspection.FORMULAS`).
        notes: the normalisations applied, in words.
        compile_seconds: time to trace, lower and compile.
        report: the full `shardkit.inspect` report of the compiled step.
        branch_choice: with a list of `branch_counts`, the index of the one kept.
    """

    mesh: dict[str, int]
    abstract: bool
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    flops: float
    xla_flops: float | None
    collectives: dict[str, dict[str, float]]
    notes: tuple[str, ...]
    compile_seconds: float
    report: Report | None = dataclasses.field(default=None, repr=False, compare=False)
    branch_choice: int | None = None

    @property
    def peak_bytes(self) -> int:
        """Arguments + outputs - aliased + temporaries: XLA's peak-style total."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    @property
    def collective_bytes(self) -> float:
        """Normalised bytes each device sends per step, all kinds."""
        return sum(v["bytes"] for v in self.collectives.values())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (the report left out)."""
        out = dataclasses.asdict(dataclasses.replace(self, report=None))
        out.pop("report")
        out["peak_bytes"] = self.peak_bytes
        return out


def _axes_text(mesh: Any) -> str:
    return "(" + ", ".join(f"{k}={v}" for k, v in dict(mesh.shape).items()) + ")"


def _check_inputs(args: tuple, mesh: Any, zero_axis: Any) -> None:
    """Refuses a `zero_axis` that `mesh` lacks and an argument laid out on another mesh (the
    compiler's own error names neither the argument nor the fix)."""
    names = (zero_axis,) if isinstance(zero_axis, str) else tuple(zero_axis or ())
    missing = [a for a in names if a not in mesh.axis_names]
    if missing:
        raise ShardkitValueError(
            f"measure(zero_axis={zero_axis!r}): {', '.join(map(repr, missing))} is not an axis "
            f"of the mesh {_axes_text(mesh)}; fix: zero_axis= one of {tuple(mesh.axis_names)} "
            f"(the axis gradients are split over), or leave it out."
        )
    leaves = jax.tree_util.tree_leaves_with_path(args)
    for path, leaf in leaves:
        sharding = getattr(leaf, "sharding", None)
        if not isinstance(sharding, NamedSharding):
            continue
        if dict(sharding.mesh.shape) != dict(mesh.shape):
            spec = ", ".join(map(repr, sharding.spec))
            raise ShardkitValueError(
                f"measure(args{jax.tree_util.keystr(path)}) of shape {tuple(leaf.shape)} is laid "
                f"out on the mesh {_axes_text(sharding.mesh)}, not on mesh= "
                f"{_axes_text(mesh)}; fix: jax.ShapeDtypeStruct({tuple(leaf.shape)}, "
                f"{jnp.dtype(leaf.dtype).name}, sharding=NamedSharding(mesh, P({spec}))) with "
                f"the mesh passed as mesh=."
            )


def _compile(fn: Any, args: tuple, mesh: Any) -> tuple[Any, bool]:
    """Compiles `fn` for abstract `args` on `mesh` (real or abstract); (compiled, abstract)."""

    jitted = fn if hasattr(fn, "trace") else jax.jit(fn)
    abstract = isinstance(mesh, AbstractMesh)
    if not abstract:
        with jax.set_mesh(mesh):
            return jitted.lower(*args).compile(), False
    with jax.sharding.use_abstract_mesh(mesh):
        lowered = jitted.trace(*args).lower(lowering_platforms=("cpu",))
    device = jax.devices("cpu")[0]
    return lowered.compile(device_assignment=(device,) * mesh.size), True


def matmul_flops(module: Any) -> tuple[float, bool]:
    """FLOPs of every dot in a compiled program, loop bodies times their trip counts.

    `cost_analysis()` counts a while loop's body once, so for a scanned model it misses all
    but one layer. This sums 2 x result elements x contracted size over the `dot`
    instructions of every computation (fusions included), times how often the computation
    runs (`shardkit.inspection.hlo.execution_counts`).

    Returns:
        (FLOPs, whether every count was known; unknown counts are taken as 1).
    """

    counts = execution_counts(module)
    total, known = 0.0, True
    for comp, instrs in module.computations.items():
        for ins in instrs:
            if ins.opcode != "dot" or not ins.operands:
                continue
            lhs = module.symbol(comp, ins.operands[0])
            if lhs is None or not lhs.arrays or not ins.arrays:
                known = False
                continue
            dims = lhs.arrays[0].dims
            contracted = re.findall(r"\d+", ins.attr("lhs_contracting_dims") or "")
            k = math.prod(dims[int(d)] for d in contracted)
            n = counts.get(comp)
            known = known and n is not None
            total += 2.0 * math.prod(ins.arrays[0].dims) * k * (n if n is not None else 1)
    return total, known


def _narrowed_after(module: Any) -> set[str]:
    """Names of f32 collectives whose every user first converts the result to bf16/f16.

    XLA:CPU sinks the cast of fp32 weights to bf16 below their all-gather (a GPU gathers the
    bf16 copy); such a collective carries bf16 data.
    """

    users: dict[tuple[str, str], list] = {}
    for comp, instrs in module.computations.items():
        for ins in instrs:
            for op in ins.operands:
                users.setdefault((comp, op), []).append(ins)

    def narrows(user: Any, name: str) -> bool:
        if user.opcode == "convert":
            return bool(user.arrays) and user.arrays[0].dtype in _NARROW_BYTES
        if user.opcode != "fusion" or name not in user.operands:
            return False
        body = module.computations.get((user.attr("calls") or "").lstrip("%"), [])
        index = user.operands.index(name)
        params = [i.name for i in body if re.fullmatch(rf"param_{index}(\.\d+)?", i.name)]
        return bool(params) and any(
            i.opcode == "convert" and i.operands[:1] == (params[0],) and i.arrays
            and i.arrays[0].dtype in _NARROW_BYTES
            for i in body
        )  # fmt: skip

    out = set()
    for ins in module.collectives():
        if not ins.arrays or ins.arrays[0].dtype not in _WIDE_BYTES or len(ins.arrays) > 1:
            continue
        found = users.get((ins.computation, ins.name), [])
        if found and all(narrows(u, ins.name) for u in found):
            out.add(ins.name)
    return out


def _sliced_after(module: Any) -> set[str]:
    """Names of all-reduces whose every result is read only through a `dynamic-slice`.

    XLA:CPU keeps such an all-reduce and slices its result where GPU backends rewrite the pair
    into a reduce-scatter (the reduction of accumulated ZeRO-1 gradients after the micro-batch
    loop, outside the backward pass, is one).
    """

    users: dict[tuple[str, str], list] = {}
    for comp, instrs in module.computations.items():
        for ins in instrs:
            for op in ins.operands:
                users.setdefault((comp, op), []).append(ins)

    def slices(comp: str, name: str) -> bool:
        found = users.get((comp, name), [])
        return bool(found) and all(slice_use(comp, u, name) for u in found)

    def slice_use(comp: str, user: Any, name: str) -> bool:
        if user.opcode == "get-tuple-element":
            return slices(comp, user.name)
        if user.opcode == "dynamic-slice":
            return user.operands[:1] == (name,)
        if user.opcode != "fusion":
            return False
        body = (user.attr("calls") or "").lstrip("%")
        index = user.operands.index(name)
        params = [i.name for i in module.computations.get(body, [])
                  if re.fullmatch(rf"param_{index}(\.\d+)?", i.name)]  # fmt: skip
        inside = users.get((body, params[0]), []) if len(params) == 1 else []
        return bool(inside) and all(
            u.opcode == "dynamic-slice" and u.operands[:1] == (params[0],) for u in inside
        )

    return {
        ins.name
        for ins in module.collectives()
        if ins.kind == "all-reduce" and slices(ins.computation, ins.name)
    }


def _promoted(module: Any) -> set[str]:
    """Names of all-reduces and reduce-scatters whose reduction XLA promoted from a narrow
    type (`*_promoted`)."""
    names = set()
    for ins in module.collectives():
        apply = ins.attr("to_apply") or ""
        if ins.kind in ("all-reduce", "reduce-scatter") and apply.endswith("_promoted"):
            names.add(ins.name)
    return names


def normalise(
    report: Report,
    *,
    zero_axis: str | tuple[str, ...] | None = None,
    promoted: set[str] = frozenset(),
    sliced: set[str] = frozenset(),
) -> tuple[dict[str, dict[str, float]], tuple[str, ...]]:
    """Bytes per collective kind with XLA:CPU's f32 upcast and gradient all-reduce undone.

    Args:
        report: a `shardkit.inspect` report.
        zero_axis: the mesh axis gradients are split over (ZeRO), e.g. "fsdp"; an all-reduce
            over a group holding it, in the backward pass or named in `sliced`, counts as a
            reduce-scatter over it plus an all-reduce of the shard over the rest of the group.
            A tuple names several such axes (the first in the all-reduce's group is used).
            None: no such rewrite.
        promoted: names of collectives that carry bf16 data in f32: all-reduces whose
            reduction XLA promoted from bf16, and collectives whose result every user casts
            to bf16 straight away (see module doc).
        sliced: names of all-reduces whose results are read only through a slice (see
            `_sliced_after`).

    Returns:
        (kind -> {"count", "bytes", "raw_bytes"}, notes describing what was normalised).
    """
    out: dict[str, dict[str, float]] = {}
    upcast = split = 0
    zero_axes = (zero_axis,) if isinstance(zero_axis, str) else tuple(zero_axis or ())

    def add(kind: str, count: int, moved: float, raw: float) -> None:
        row = out.setdefault(kind, {"count": 0, "bytes": 0.0, "raw_bytes": 0.0})
        row["count"] += count
        row["bytes"] += moved
        row["raw_bytes"] += raw

    for c in report.collectives:
        count = c.count if c.count is not None else 1
        narrow = c.upcast_from in _NARROW_BYTES or c.name in promoted
        scale = 1.0
        if narrow and c.dtype in _WIDE_BYTES:
            scale = _NARROW_BYTES.get(c.upcast_from or "bf16", 2) / _WIDE_BYTES[c.dtype]
            upcast += 1
        buf = c.buffer_bytes * scale
        axes = c.axes or ()
        gradient = "transpose(" in (c.op_name or "") or c.name in sliced
        over = next((a for a in zero_axes if a in axes), None)
        if c.kind == "all-reduce" and over is not None and gradient and c.group_size > 1:
            z = report.mesh.get(over, 1)
            rest = c.group_size // z
            add("reduce-scatter", count, count * bytes_moved("reduce-scatter", buf, z), 0.0)
            ar = count * bytes_moved("all-reduce", buf / z, rest)
            add("all-reduce", count if rest > 1 else 0, ar, c.total_bytes)
            split += 1
            continue
        add(c.kind, count, c.total_bytes * scale, c.total_bytes)
    notes = []
    if upcast:
        notes.append(
            f"{upcast} collective(s) XLA:CPU ran in f32 on bf16 data counted at 2 bytes per "
            "element (GPU and TPU keep bf16)"
        )
    if split:
        notes.append(
            f"{split} gradient all-reduce(s) over {' or '.join(map(repr, zero_axes))} counted as "
            "the reduce-scatter a "
            "GPU/TPU emits (XLA:CPU all-reduces, then slices)"
        )
    return out, tuple(notes)


def measure(
    fn: Any,
    *args: Any,
    mesh: Any,
    zero_axis: str | tuple[str, ...] | None = None,
    inspect_text: bool = True,
    branch_counts: Any = None,
) -> Measurement:
    """Compiles a jitted step for abstract arguments on `mesh` and measures it.

    Generic mode: any `jax.jit`-wrapped step (with `in_shardings`/`out_shardings` as it will
    run) and `jax.ShapeDtypeStruct` arguments whose shardings use `mesh`.

    Args:
        fn: a `jax.jit`-wrapped function (a plain function is jitted).
        *args: `jax.ShapeDtypeStruct`s (with `sharding=NamedSharding(mesh, P(...))`).
        mesh: a `jax.sharding.Mesh` of present devices, or an `AbstractMesh` of any size.
        zero_axis: mesh axis (or axes) gradients are split over, for the reduce-scatter
            normalisation (see `normalise`).
        inspect_text: read the collectives (False: memory and FLOPs only, faster).
        branch_counts: executions per branch of data-dependent conditionals (e.g. a
            `lax.switch` over a table in a scan), keyed by instruction name or `op_name`
            component; see `shardkit.inspection.hlo.execution_counts`. A list of such
            mappings (one per device whose branches differ): the one giving the most
            collective bytes, the busiest device, is kept (`Measurement.branch_choice`).
            Collectives only: FLOPs still count every branch at every step.

    Returns:
        A `Measurement`.

    Raises:
        ValueError: when `mesh` is neither a Mesh nor an AbstractMesh, an argument is laid out
            on another mesh, or `zero_axis` names an axis `mesh` lacks.

    Example:
        >>> am = jax.sharding.AbstractMesh((512,), ("data",))
        >>> x = jax.ShapeDtypeStruct((1024, 64), jnp.float32,
        ...                          sharding=NamedSharding(am, P("data")))
        >>> measure(jax.jit(lambda x: x.sum()), x, mesh=am).collectives["all-reduce"]["count"]
        1
    """

    if not isinstance(mesh, Mesh | AbstractMesh):
        raise ShardkitValueError(
            f"measure(mesh=...) needs a jax.sharding.Mesh or AbstractMesh, got "
            f"{type(mesh).__name__}; fix: mesh=jax.sharding.AbstractMesh((512,), ('data',))."
        )
    _check_inputs(args, mesh, zero_axis)
    t0 = time.perf_counter()
    compiled, abstract = _compile(fn, args, mesh)
    seconds = time.perf_counter() - t0
    options = [branch_counts] if branch_counts is None or hasattr(branch_counts, "keys") else (
        list(branch_counts)
    )  # fmt: skip
    report = inspect(compiled, mesh=mesh, branch_counts=options[0]) if inspect_text else None
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, list | tuple) and cost else cost) or {}
    module = parse_hlo(compiled.as_text())
    flops, known = matmul_flops(module)
    kinds: dict[str, dict[str, float]] = {}
    notes: tuple[str, ...] = ()
    choice = 0 if len(options) > 1 else None
    if report is not None:
        narrow = _promoted(module) | _narrowed_after(module)
        sliced = _sliced_after(module) if zero_axis else set()
        kinds, notes = normalise(report, zero_axis=zero_axis, promoted=narrow, sliced=sliced)
        names, sizes = tuple(report.mesh), tuple(report.mesh.values())
        for i, alt in enumerate(options[1:], 1):  # the busiest device's branches
            other = dataclasses.replace(
                report, collectives=collectives_of(module, names, sizes, branch_counts=alt)
            )
            got = normalise(other, zero_axis=zero_axis, promoted=narrow, sliced=sliced)
            if sum(v["bytes"] for v in got[0].values()) > sum(v["bytes"] for v in kinds.values()):
                report, (kinds, notes), choice = other, got, i
    if not known:
        notes += ("some loop trip counts are unknown: their matmul FLOPs are counted once",)
    return Measurement(
        mesh={str(k): int(v) for k, v in dict(mesh.shape).items()},
        abstract=abstract,
        argument_bytes=int(mem.argument_size_in_bytes),
        output_bytes=int(mem.output_size_in_bytes),
        alias_bytes=int(mem.alias_size_in_bytes),
        temp_bytes=int(mem.temp_size_in_bytes),
        flops=flops,
        xla_flops=cost.get("flops"),
        collectives=kinds,
        notes=notes,
        compile_seconds=seconds,
        report=report,
        branch_choice=choice,
    )


def measure_gpt(
    model: Any,
    strategy: Any,
    *,
    devices: int,
    batch: int,
    grad_accum: int = 1,
    precision: str = "bfloat16",
    abstract: bool | None = None,
    inspect_text: bool = True,
) -> Measurement:
    """Compiles shardkit's GPT training step (Trainer, AdamW) for a strategy at a scale.

    Parameters are never materialised: the Trainer's abstract state and an abstract batch are
    compiled exactly as `Trainer.compile_step` compiles them.

    Args:
        model: a `shardkit.models.GPTConfig`.
        strategy: a shardkit strategy (e.g. `Hybrid(fsdp=32, tensor=8)`).
        devices: mesh size; more than `jax.device_count()` compiles on an `AbstractMesh`.
        batch: global batch size (sequences of `model.seq_len` tokens).
        grad_accum: micro-batches per step (keep 1 with a pipeline strategy: its
            `Pipeline.microbatches` sets them).
        precision: "bfloat16" (bf16 compute, fp32 master weights and Adam) or "float32".
        abstract: force (True) or forbid (False) the AbstractMesh path; default: only when
            `devices` exceeds the devices present.
        inspect_text: read the collectives (False: memory and FLOPs only).

    Returns:
        A `Measurement` of one step.

    Raises:
        ValueError: when `devices` exceeds the devices present and abstract=False, or the
            batch does not divide over the batch-splitting mesh axes x grad_accum.

    Example:
        >>> m = measure_gpt(GPTConfig(vocab=64, d_model=64, n_layers=2, n_heads=4,
        ...                           seq_len=16, remat="block"), Hybrid(fsdp=8), devices=8,
        ...                 batch=16)
        >>> m.collectives["reduce-scatter"]["count"] > 0
        True
    """

    present = jax.device_count()
    if abstract is None:
        abstract = devices > present
    if not abstract and devices > present:
        raise ShardkitValueError(
            f"measure_gpt(devices={devices}, abstract=False): only {present} devices are "
            f"present; fix: abstract=True (compile on an AbstractMesh) or devices<={present}."
        )
    axes = strategy.mesh_axes(devices)
    if abstract:
        mesh = AbstractMesh(
            tuple(axes.values()), tuple(axes), axis_types=(AxisType.Auto,) * len(axes)
        )
    else:
        mesh = strategy.make_mesh(jax.devices()[:devices])
    trainer = Trainer(
        lambda key: GPT(model, rngs=nnx.Rngs(key)),
        optax.adamw(1e-3),
        lm_loss,
        strategy=strategy,
        mesh=mesh,
        grad_accum=grad_accum,
        compute_dtype=precision,
    )
    divisor = trainer.batch_divisor()
    if batch % divisor:
        raise ShardkitValueError(
            f"measure_gpt(batch={batch}) does not divide over the batch-splitting mesh axes "
            f"x grad_accum={grad_accum} ({divisor}) of mesh {axes}; fix: batch="
            f"{max(divisor, batch // divisor * divisor)}."
        )
    abstract_batch = _abstract_batch(trainer, batch, model.seq_len)
    step = trainer.jit_step({k: v.sharding for k, v in abstract_batch.items()})
    zero_axis = ("fsdp",) if axes.get("fsdp", 1) > 1 else ()
    if trainer.bound.sequence_parallel:
        # sequence parallelism: the row-parallel reductions onto sequence slices and the
        # backward pass's input-gradient reductions are the reduce-scatters GPUs emit
        zero_axis += ("tensor",)
    counts = _pipeline_branch_counts(trainer.pipeline, axes) if trainer.pipeline else None
    m = measure(
        step,
        trainer.abstract_state,
        abstract_batch,
        mesh=mesh,
        zero_axis=zero_axis,
        inspect_text=inspect_text,
        branch_counts=[pattern for _, pattern in counts] if counts else None,
    )
    if counts and inspect_text:
        note = (
            "pipelined steps: collectives inside the executor's lax.switch branches counted "
            "as often as the step table runs each branch on the stage that moves the most "
            "bytes, not at every step"
        )
        m = dataclasses.replace(m, notes=(*m.notes, note))
    return m


def _abstract_batch(trainer: Any, batch: int, seq_len: int) -> dict:
    """The GPT's batch (inputs, targets, mask) as ShapeDtypeStructs laid out as the Trainer
    places it (micro-batches leading when there are several)."""
    micro = trainer.microbatches  # grad_accum, or the pipeline's micro-batches
    shape = (batch, seq_len) if micro == 1 else (micro, batch // micro, seq_len)
    spec = trainer.bound.batch_spec(2)
    if micro > 1:
        spec = P(None, *spec)
    sharding = NamedSharding(trainer.mesh, spec)
    dtypes = {"inputs": jnp.int32, "targets": jnp.int32, "mask": jnp.float32}
    return {k: jax.ShapeDtypeStruct(shape, d, sharding=sharding) for k, d in dtypes.items()}


def _pipeline_branch_counts(pipeline: Any, axes: dict[str, int]) -> list[tuple[int, dict]]:
    """(stage index, lane scope -> executions per branch), one per distinct count pattern.

    Every device runs the same ops of each kind per lane; the last stage's run as their
    last-stage twins (with the loss head), so the pattern of stage 0 and of the last stage
    are usually the only two.
    """

    tbl = table(pipeline.schedule, axes["stage"], pipeline.microbatches)
    lanes = branch_counts(tbl)
    out: list[tuple[int, dict]] = []
    for d in range(axes["stage"]):
        pattern = {LANE_SCOPE.format(i): tuple(int(n) for n in c[d]) for i, c in enumerate(lanes)}
        if all(pattern != seen for _, seen in out):
            out.append((d, pattern))
    return out
