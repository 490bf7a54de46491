"""Training benchmark, measured side by side in one run on 8 simulated CPU devices.

1. Overhead: shardkit's `Trainer.step` vs a hand-written `jax.jit` step with the same
   shardings, donation and math (target ratio <= 1.02). Timed in interleaved rounds (median),
   so machine load affects both alike.
2. Communication: for each strategy, the bytes each device sends per step according to the
   compiled program (`shardkit.inspect`, ring formulas) vs the theoretical lower bound:
     DP:     all-reduce of gradients            2(N-1)/N x P
     ZeRO-1: reduce-scatter grads + all-gather params  2(N-1)/N x P
     ZeRO-3: all-gather params + reduce-scatter grads  2(N-1)/N x P (3(N-1)/N x P if the
             backward pass gathers again)
     TP:     2 all-reduces of activations per block forward, 2 backward, plus the
             vocab-parallel embedding (forward) and output head (backward): 2(N-1)/N x A x (4L+2)
   with P = float32 parameter bytes, A = batch x seq x d_model x 4 bytes. XLA:CPU reduces FSDP
   gradients with an all-reduce where GPUs use a reduce-scatter (half the bytes); the
   "CPU-normalised" column counts those all-reduces as reduce-scatters. Everything is
   float32 here, so XLA:CPU's upcast of bf16 collectives to f32 does not inflate the figures;
   with --precision bfloat16 gradients are still reduced in float32 (fp32 master weights).

3. Gradient accumulation, sequence parallelism and collective matmul: bytes per device per
   step at 1 and 4 micro-batches, for DP, ZeRO-1, ZeRO-3, TP, TP + SP, TP + SP + overlapped
   matmuls and the same on data x tensor, against `shardkit.verify.bounds.traffic_lower_bound`;
   and the step times of TP, TP + SP and TP + SP + overlap side by side.

Run: python benchmarks/train.py [--rounds 7]
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse
import statistics
import time

import jax
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.inspection import inspect
from shardkit.models import GPT, GPTConfig, lm_loss
from shardkit.strategies import FSDP, DataParallel, Hybrid, TensorParallel
from shardkit.train import ReverseTask, Trainer
from shardkit.train.trainer import TrainState
from shardkit.verify import measure_gpt
from shardkit.verify.bounds import traffic_lower_bound

TASK = ReverseTask(digits=15, length=16)
CFG = GPTConfig(vocab=TASK.vocab, d_model=128, n_layers=2, n_heads=8, seq_len=TASK.seq_len)
BATCH = 32


def make(strategy, grad_accum=1):
    return Trainer(lambda k: GPT(CFG, rngs=nnx.Rngs(k)), optax.adam(1e-3), lm_loss,
                   strategy=strategy, grad_accum=grad_accum)  # fmt: skip


def hand_written_step(trainer):
    """The same step written directly with jax.jit, nnx and optax (no shardkit in the loop)."""
    graphdef = trainer.graphdef  # the model's static structure (NNX)
    mesh = trainer.mesh
    gather = jax.tree.map(
        lambda s: NamedSharding(mesh, s), trainer.compute_specs, is_leaf=lambda x: isinstance(x, P)
    )
    opt_sh = jax.tree.map(
        lambda s: NamedSharding(mesh, s),
        trainer._opt_param_specs,
        is_leaf=lambda x: isinstance(x, P),
    )
    param_sh = jax.tree.map(
        lambda s: NamedSharding(mesh, s), trainer.param_specs, is_leaf=lambda x: isinstance(x, P)
    )
    optimizer = optax.adam(1e-3)

    def loss(params, batch):
        params = jax.lax.with_sharding_constraint(params, gather)
        return lm_loss(nnx.merge(graphdef, params), batch)

    def step(state, batch):
        (l, aux), grads = jax.value_and_grad(loss, has_aux=True)(state.params, batch)
        grads = jax.lax.with_sharding_constraint(grads, opt_sh)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = jax.lax.with_sharding_constraint(
            optax.apply_updates(state.params, updates), param_sh
        )
        new = TrainState(state.step + 1, params, opt_state, state.model_state)
        return new, {"loss": l, **aux}

    return jax.jit(
        step,
        in_shardings=(trainer.state_shardings, None),
        out_shardings=(trainer.state_shardings, NamedSharding(mesh, P())),
        donate_argnums=(0,),
    )


def overhead(rounds: int) -> None:
    trainer = make(Hybrid(fsdp=4, tensor=2))
    batch = trainer.place_batch(TASK.batch(0, batch_size=BATCH))
    ours = trainer.compile_step(batch)
    theirs = hand_written_step(trainer)
    s1, s2 = trainer.init(0), trainer.init(0)
    s1, _ = trainer.step(s1, batch)
    s2, _ = theirs(s2, batch)
    times = {"shardkit": [], "jax.jit": []}
    for _ in range(rounds):
        for name in times:
            t0 = time.perf_counter()
            for _ in range(10):
                if name == "shardkit":
                    s1, m = trainer.step(s1, batch)
                else:
                    s2, m = theirs(s2, batch)
            jax.block_until_ready(m)
            times[name].append((time.perf_counter() - t0) / 10)
    a, b = statistics.median(times["shardkit"]), statistics.median(times["jax.jit"])
    same = float(trainer.evaluate(s1.params, batch)["loss"]) == float(
        trainer.evaluate(s2.params, batch)["loss"]
    )
    print("== step overhead: Hybrid(fsdp=4, tensor=2), GPT d=128 L=2, batch 32 x 32 tokens")
    print(f"shardkit Trainer.step   {a * 1e3:8.2f} ms (median of {rounds} rounds of 10)")
    print(f"hand-written jax.jit    {b * 1e3:8.2f} ms")
    print(f"ratio shardkit/jax.jit  {a / b:8.3f}   (target <= 1.02); same losses: {same}")
    del ours


def communication() -> None:
    n = 8
    p_bytes = 4 * CFG.n_params()
    act = BATCH * CFG.seq_len * CFG.d_model * 4
    ring = (n - 1) / n
    cases = [
        ("DataParallel x8", DataParallel(), 2 * ring * p_bytes),
        ("FSDP ZeRO-1 x8", FSDP(zero=1), 2 * ring * p_bytes),
        ("FSDP ZeRO-3 x8", FSDP(), 2 * ring * p_bytes),
        ("TensorParallel x8", TensorParallel(), 2 * ring * act * (4 * CFG.n_layers + 2)),
    ]
    print("\n== bytes sent per device per step: compiled (shardkit.inspect) vs lower bound")
    print(
        f"{'strategy':<20}{'compiled':>14}{'lower bound':>14}{'ratio':>8}"
        f"{'CPU-normalised':>16}{'ratio':>8}  by kind"
    )
    for label, strategy, bound in cases:
        trainer = make(strategy)
        batch = trainer.place_batch(TASK.batch(0, batch_size=BATCH))
        report = inspect(trainer.compile_step(batch), mesh=trainer.mesh)
        total = report.total_bytes
        kinds = ", ".join(
            f"{k} {v['bytes'] / 2**10:,.0f} KiB" for k, v in report.by_kind().items() if v["count"]
        )
        by_kind = report.by_kind()
        norm = total
        if label.startswith("FSDP"):  # gradient all-reduce -> reduce-scatter on GPU
            norm = total - by_kind.get("all-reduce", {"bytes": 0})["bytes"] / 2
        print(
            f"{label:<20}{total / 2**10:>11,.0f} KiB{bound / 2**10:>11,.0f} KiB"
            f"{total / bound:>8.2f}{norm / 2**10:>13,.0f} KiB{norm / bound:>8.2f}  {kinds}"
        )


def accumulation_and_sequence(rounds: int) -> None:
    """Bytes per device per step at 1 and 4 micro-batches against `traffic_lower_bound`, after
    CPU normalisation (`measure_gpt`: an all-reduce XLA:CPU reads through a slice, or runs in
    the backward pass over the ZeRO or, under sequence parallelism, the tensor axis, counts as
    the reduce-scatter GPUs emit), float32; then the step times of TP, TP + SP and TP + SP +
    collective matmul side by side (interleaved rounds, the median; XLA:CPU runs collectives
    synchronously, so the overlap cannot pay here: the column shows its cost on CPU)."""
    n = 8
    sp = {"sequence_parallel": True}
    cm = {"sequence_parallel": True, "collective_matmul": True}
    cases = [
        ("DataParallel", DataParallel()),
        ("FSDP ZeRO-1", FSDP(zero=1)),
        ("FSDP ZeRO-3", FSDP()),  # gathers and reduce-scatters per micro-batch (memory)
        ("TP", TensorParallel()),
        ("TP + SP", TensorParallel(**sp)),
        ("TP + SP + overlap", TensorParallel(**cm)),
        ("data2 x TP4", Hybrid(data=2, tensor=4)),
        ("data2 x TP4 + SP", Hybrid(data=2, tensor=4, **sp)),
        ("data2 x TP4 + SP + ov", Hybrid(data=2, tensor=4, **cm)),
    ]
    print(f"\n== bytes per device per step vs lower bound, {n} devices, float32, CPU-normalised")
    print(f"{'strategy':<22}{'micro-batches':>14}{'compiled':>14}{'lower bound':>14}{'ratio':>8}")
    for label, strategy in cases:
        for m in (1, 4):
            got = measure_gpt(CFG, strategy, devices=n, batch=BATCH, grad_accum=m,
                              precision="float32")  # fmt: skip
            total = sum(v["bytes"] for v in got.collectives.values())
            bound = traffic_lower_bound(CFG, strategy, devices=n, batch=BATCH, grad_accum=m)
            least = bound["total"]
            print(f"{label:<22}{m:>14}{total / 2**10:>11,.0f} KiB"
                  f"{least / 2**10:>11,.0f} KiB{total / least:>8.2f}")  # fmt: skip
    timed = {(label, m): make(s, m) for label, s in cases[3:6] for m in (1, 4)}
    states, times = {}, {key: [] for key in timed}
    batch = {m: TASK.batch(0, batch_size=BATCH) for m in (1, 4)}
    for key, trainer in timed.items():
        states[key], _ = trainer.step(trainer.init(0), trainer.place_batch(batch[key[1]]))
    for _ in range(rounds):
        for key, trainer in timed.items():
            placed = trainer.place_batch(batch[key[1]])
            t0 = time.perf_counter()
            for _ in range(5):
                states[key], metrics = trainer.step(states[key], placed)
            jax.block_until_ready(metrics)
            times[key].append((time.perf_counter() - t0) / 5)
    print(f"\n== step time, median of {rounds} interleaved rounds of 5 steps (CPU), vs TP")
    print(f"{'strategy':<22}{'micro-batches':>14}{'step':>12}{'ratio':>8}")
    for (label, m), ts in times.items():
        t, base = statistics.median(ts), statistics.median(times[("TP", m)])
        print(f"{label:<22}{m:>14}{t * 1e3:>9.2f} ms{t / base:>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    jax.config.update("jax_threefry_partitionable", True)
    print(f"jax {jax.__version__}, {jax.device_count()} devices ({jax.default_backend()})")
    overhead(args.rounds)
    communication()
    accumulation_and_sequence(args.rounds)


if __name__ == "__main__":
    main()
