"""Multi-process runs for real on 127.0.0.1: every worker is a subprocess with a timeout.

2 processes x 4 devices against this process's 1 x 8 devices: training (DP, FSDP with
micro-batches, hybrid), the global batches of all data sources, the FFT and the LU solve; a
checkpoint saved by 2 processes restored in 1 and in 4; a killed rank, an unreachable
coordinator and mismatched process counts end with clear errors, never a hang.
"""

import importlib.util
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

import shardkit.distributed as skd
from shardkit import cli
from shardkit.distributed import (
    DistributedError,
    LaunchEnvironmentError,
    ProcessMeshError,
    check_mesh,
    detect_environment,
    free_port,
)
from shardkit.distributed.launch import rank_env
from shardkit.distributed.runtime import _check_port_free
from shardkit.mesh import make_mesh
from shardkit.strategies import FSDP, DataParallel, Hybrid
from shardkit.train import BatchSizeError, Checkpointer, ReverseTask, TeacherTask, TokenFile
from shardkit.train import command as train_command

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
TIMEOUT = 240  # generous: the machine is shared; a hang still ends the test


def _load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # initialize() is a no-op here: one process
    return module


def _expected(module) -> list[str]:
    block = module.__doc__.split("Expected output", 1)[1].split(":\n", 1)[1]
    return [line.strip() for line in block.split("\n\n", 1)[0].strip().splitlines()]


# gloo's connection message, printed by C++ threads that may split it across output lines
_GLOO = "[Gloo] Rank 0 is connected to 0 peer ranks. Expected number of connected peer ranks is : 0"


def _gloo_noise(text: str) -> bool:
    """Whether `text` is made of pieces of gloo's connection message (digits aside).

    Several C++ threads print that message at once, so pieces interleave character by character
    ("[Gloo] Rank [Gloo] Rank 11Expected ..."): a line counts as noise when it is blank (a
    newline cut off from the message; rank 0 printed one in CI) or only digits (a count cut
    off from its message), when every character in it
    occurs in the message and it carries the "[Gloo]" tag, or, for a tail cut off from its tag,
    when each of its words occurs in the message. A user line eaten here fails the comparison
    that follows.
    """
    if not text.strip():
        return True  # the expected output has no blank line: a newline cut off from gloo's
    text = re.sub(r"\d+", "", text).strip()
    if not text:
        return True  # a lone count cut off from the message ("3")
    if "[Gloo]" in text:
        return set(text) <= set(_GLOO)
    return all(word in _GLOO for word in text.split())


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDKIT_")}
    env.pop("XLA_FLAGS", None)  # the launcher sets the device count of each rank
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _launch(n: int, devices: int, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "shardkit.cli", "launch", "-n", str(n)]
    cmd += ["--devices-per-process", str(devices), "--", sys.executable, *args]
    return subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, out[-3000:]
    return out


def test_two_processes_equal_one_train_data_fft_solve_checkpoints(tmp_path):
    train = _launch(2, 4, str(EXAMPLES / "multihost_train.py"), "--out", str(tmp_path))
    fft = _launch(2, 4, str(EXAMPLES / "multihost_fft_solve.py"), "--out", str(tmp_path))
    # references: the same code in this process, 1 process x 8 devices
    example = _load("multihost_train")
    data = TeacherTask(features=example.SIZES[0], classes=example.SIZES[-1])
    strategies = {"dp": (DataParallel(), 1), "fsdp": (FSDP(), 2), "hybrid": (Hybrid(fsdp=4), 1)}
    strategies["hybrid"] = (Hybrid(fsdp=4, tensor=2), 1)
    ref = {name: example.run(s, data, grad_accum=a) for name, (s, a) in strategies.items()}

    out = _finish(train)
    printed = [
        line[len("[rank 0] ") :] for line in out.splitlines() if line.startswith("[rank 0] ")
    ]
    assert [x for x in printed if not _gloo_noise(x)] == _expected(example)
    rank1 = [line[len("[rank 1] ") :] for line in out.splitlines() if line.startswith("[rank 1] ")]
    assert [x for x in rank1 if x.strip() and not _gloo_noise(x)] == []  # only process 0 prints
    got = np.load(tmp_path / "train.npz")
    for name, (trainer, state, losses) in ref.items():
        assert trainer.mesh.size == 8 and jax.process_count() == 1
        # float32 sums in another order across processes: equal to rounding
        np.testing.assert_allclose(got[f"{name}/losses"], losses, rtol=2e-6)
        for i, leaf in enumerate(jax.tree.leaves(state.params)):
            np.testing.assert_allclose(got[f"{name}/param{i}"], leaf, rtol=1e-5, atol=1e-7)
    # the global batch assembled from the processes' own rows is the one-process batch
    np.testing.assert_array_equal(
        got["batch/reverse"], ReverseTask(digits=7, length=4).batch(5, batch_size=16)["inputs"]
    )
    tokens = example.token_file()
    np.testing.assert_array_equal(got["batch/tokens"], tokens.batch(5, batch_size=16)["inputs"])

    # the checkpoint saved by 2 processes: restore in 4 processes (FSDP) and here (DP, 1 process)
    restore4 = _launch(4, 2, str(EXAMPLES / "multihost_train.py"), "--restore", str(tmp_path))
    saved = [got[f"hybrid/state{i}"] for i in range(len(jax.tree.leaves(ref["hybrid"][1])))]
    assert int(saved[0]) == example.STEPS
    ckpt = Checkpointer(tmp_path / "ckpt")
    here = ckpt.restore(example.make_trainer(DataParallel()))
    ckpt.close()
    for a, b in zip(saved, jax.tree.leaves(jax.device_get(here)), strict=True):
        np.testing.assert_array_equal(a, b)  # exact: a checkpoint is bits, not a computation

    out = _finish(fft)
    assert "2 processes" in out and out.count(": True") == 3, out
    fft_example = _load("multihost_fft_solve")
    field, a, b = fft_example.inputs()
    got = np.load(tmp_path / "fft_solve.npz")
    np.testing.assert_allclose(got["fft"], np.fft.fftn(field.astype(np.float64)), atol=2e-4)
    np.testing.assert_allclose(got["solve"], np.linalg.solve(a, b), rtol=1e-4, atol=1e-5)
    _, y_one, _, x_one = fft_example.compute()  # the same kernels, 1 process x 8 devices
    np.testing.assert_allclose(got["fft"], y_one, rtol=0, atol=1e-6 * np.abs(y_one).max())
    np.testing.assert_allclose(got["solve"], x_one, rtol=1e-6, atol=1e-7)

    out = _finish(restore4)
    assert "[rank 0] restored step 3 onto Mesh(fsdp=8" in out and "4 processes" in out
    four = np.load(tmp_path / "restored-4.npz")
    assert len(four.files) == len(saved)
    for i, x in enumerate(saved):
        np.testing.assert_array_equal(four[f"state{i}"], x)


FAIL_WORKER = textwrap.dedent(
    """
    import os, sys
    import shardkit.distributed as skd
    info = skd.initialize(timeout=float(os.environ.get("WORKER_TIMEOUT", "60")))
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    step = jax.jit(lambda x: x + jnp.sum(x) * 1e-9, out_shardings=NamedSharding(mesh, P("data")))
    x = jax.make_array_from_process_local_data(
        NamedSharding(mesh, P("data")), np.ones(4, np.float32), (4 * info.num_processes,))
    for i in range(100000):
        x = step(x)
        float(x.addressable_data(0)[0])
        print("step", i, flush=True)
        if i == 5 and info.process_id == 1:
            os.kill(os.getpid(), signal.SIGKILL)
    """
).replace("import os, sys", "import os, signal, sys")


def _rank(worker, rank, n, address, **extra) -> subprocess.Popen:
    env = rank_env(rank, n, address, devices_per_process=1, base=_env()) | extra
    return subprocess.Popen(
        [sys.executable, str(worker)], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_failures_end_with_clear_errors_never_hang(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(FAIL_WORKER)
    t0 = time.monotonic()
    # 1. through the launcher: rank 1 is SIGKILLed after 6 steps; the launcher stops rank 0
    launched = subprocess.Popen(
        [sys.executable, "-m", "shardkit.cli", "launch", "-n", "2", "--devices-per-process",
         "1", "--", sys.executable, str(worker)],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    # 2. no launcher: JAX's heartbeat (10 s in shardkit.distributed) stops the survivor
    address = f"127.0.0.1:{free_port()}"
    bare = [_rank(worker, r, 2, address) for r in (0, 1)]
    # 3. an address nobody listens on: a clear error after the timeout, not an abort
    lonely = _rank(worker, 1, 2, f"127.0.0.1:{free_port()}", WORKER_TIMEOUT="2")
    # 4. processes started with different counts
    address = f"127.0.0.1:{free_port()}"
    mismatched = [
        _rank(worker, 0, 2, address, WORKER_TIMEOUT="5"),
        _rank(worker, 1, 3, address, WORKER_TIMEOUT="5"),
    ]

    procs = [launched, *bare, lonely, *mismatched]
    ended = {}
    while len(ended) < len(procs) and time.monotonic() - t0 < TIMEOUT:
        ended.update({i: time.monotonic() for i, p in enumerate(procs) if p.poll() is not None
                      and i not in ended})  # fmt: skip
        time.sleep(0.1)
    out, _ = launched.communicate(timeout=TIMEOUT)
    assert launched.returncode == 128 + signal.SIGKILL, out[-3000:]
    assert "[rank 1] step 5" in out
    assert "[launch] rank 1 killed by SIGKILL; stopping ranks [0]" in out, out[-3000:]

    outs = [proc.communicate(timeout=TIMEOUT)[0] for proc in bare]
    assert bare[1].returncode == -signal.SIGKILL
    # the survivor ends with its own error: its collective fails and, since an uncaught error
    # ends a rank at once, it exits 1; where the collective does not fail first, JAX's
    # heartbeat aborts it
    if bare[0].returncode == -signal.SIGABRT:
        assert "JAX distributed service detected fatal errors" in outs[0], outs[0][-3000:]
        assert re.search(r"stopped sending heartbeats|another task died", outs[0])
    else:
        assert bare[0].returncode == 1, outs[0][-3000:]
        assert "Traceback (most recent call last)" in outs[0] and "x = step(x)" in outs[0]

    out = lonely.communicate(timeout=TIMEOUT)[0]
    assert lonely.returncode == 1, out[-3000:]
    assert re.search(r"CoordinatorUnreachableError: coordinator 127.0.0.1:\d+ did not answer "
                     r"within 2 s .*fix: start process 0", out), out[-3000:]  # fmt: skip

    outs = [p.communicate(timeout=TIMEOUT)[0] for p in mismatched]
    assert all(p.returncode != 0 for p in mismatched), outs
    assert "ProcessCountMismatchError: process 0 was started with num_processes=2, but " \
        "process 1: num_processes=3" in outs[0], outs[0][-3000:]  # fmt: skip
    assert "process 1 was started with num_processes=3, but process 0: num_processes=2" in outs[1]
    # never a hang: the survivors stop within 60 s of the failure
    assert ended[1] - ended[2] < 60, ended  # heartbeat path: rank 0 after rank 1 died
    assert ended[0] - t0 < 60, ended  # launcher path, start-up included


def test_device_counts_that_do_not_divide_the_mesh(capsys):
    check_mesh(make_mesh({"data": 4, "tensor": 2}), devices_per_process=4)
    check_mesh(make_mesh({"data": 2, "tensor": 4}), devices_per_process=2)
    six = jax.devices()[:6]
    check_mesh(make_mesh({"data": 2, "tensor": 3}, devices=six), devices_per_process=3)
    with pytest.raises(ProcessMeshError, match=r"mesh \{'data': 3, 'tensor': 2\} does not split "
                       r"into blocks of 3 devices per process: process 0 holds mesh indices "
                       r"\{'data': \[0, 1\], 'tensor': \[0, 1\]\}.*fix: "):  # fmt: skip
        check_mesh(make_mesh({"data": 3, "tensor": 2}, devices=six), devices_per_process=3)
    with pytest.raises(ProcessMeshError, match="not a multiple of devices_per_process=3"):
        check_mesh(make_mesh({"data": 8}), devices_per_process=3)
    assert cli.main(["train", "--processes", "3", "--devices", "8"]) == 2
    err = capsys.readouterr().err
    assert "--devices 8 do not split evenly over --processes 3" in err and "fix: " in err
    with pytest.raises(SystemExit) as e:  # refused by the flag's own check, in one line
        cli.main(["launch", "-n", "0", "--", "python", "-c", "pass"])
    assert e.value.code == 2
    assert "argument -n/--processes: 0 is below 1" in capsys.readouterr().err
    # `shardkit train --processes 2 ...` hands each rank the same settings, minus --processes
    argv = ["train", "--processes", "2", "--steps", "7", "--mesh", "data=2,fsdp=4", "--resume",
            "--no-report", "--strategy", "hybrid", "--lr", "0.01"]  # fmt: skip
    args = train_command.parse_args(argv[1:])
    again = train_command.parse_args(train_command._argv(args))
    assert (args.processes, again.processes) == (2, 1) and "--processes" not in again.argv
    assert again.settings == args.settings and args.settings.steps == 7


def test_bad_arguments_are_refused_before_anything_starts():
    jax.devices()  # the backend is running (run alone, no earlier test has started it)
    with pytest.raises(DistributedError, match="give all three or none"):
        skd.initialize("127.0.0.1:5000")
    with pytest.raises(DistributedError, match=r"process_id=2 with num_processes=2: need 0 <="):
        skd.initialize("127.0.0.1:5000", num_processes=2, process_id=2)
    with pytest.raises(DistributedError, match="'nohost' is not host:port; fix: "):
        skd.initialize("nohost", num_processes=2, process_id=0)
    with pytest.raises(DistributedError, match="after JAX started its backend; fix: "):
        skd.initialize("127.0.0.1:5000", num_processes=2, process_id=0)  # pytest started JAX
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(DistributedError, match="cannot host the coordinator on port"):
            _check_port_free(f"127.0.0.1:{busy.getsockname()[1]}")
    with pytest.raises(ValueError, match="devices_per_process=0 must be >= 1; fix: "):
        skd.launch(["true"], processes=2, devices_per_process=0)
    with pytest.raises(ValueError, match="no command to launch; fix: "):
        skd.launch([], processes=2)
    trainer = _load("multihost_train").make_trainer(DataParallel())
    with pytest.raises(BatchSizeError, match=r"batch\['x'\] has 3 rows but process 0 of 1 "):
        trainer.place_local_batch({"x": np.zeros((3, 16)), "y": np.zeros(3)}, batch_size=8)
    np.testing.assert_array_equal(trainer.process_rows(8), np.arange(8))


def test_environment_detection_and_process_rows(tmp_path):
    ours = {
        "SHARDKIT_COORDINATOR_ADDRESS": "127.0.0.1:5000",
        "SHARDKIT_NUM_PROCESSES": "4",
        "SHARDKIT_PROCESS_ID": "3",
    }
    env = detect_environment(ours)
    assert (env.kind, env.coordinator_address, env.num_processes, env.process_id) == (
        "shardkit", "127.0.0.1:5000", 4, 3,
    )  # fmt: skip
    slurm = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "16", "SLURM_PROCID": "2",
             "SLURM_STEP_NODELIST": "node[1-4]", "SLURM_LOCALID": "0"}  # fmt: skip
    assert detect_environment(slurm).kind == "slurm"
    assert detect_environment(slurm | {"SLURM_NTASKS": "1"}).kind == "single"
    assert detect_environment({"OMPI_MCA_orte_hnp_uri": "x"}).kind == "openmpi"
    assert detect_environment({"TPU_WORKER_HOSTNAMES": "a,b"}).kind == "tpu"
    assert detect_environment({}).kind == "single"
    with pytest.raises(LaunchEnvironmentError, match="SHARDKIT_PROCESS_ID missing; fix: "):
        detect_environment({k: v for k, v in ours.items() if k != "SHARDKIT_PROCESS_ID"})
    with pytest.raises(LaunchEnvironmentError, match="SHARDKIT_NUM_PROCESSES='x' is not an int"):
        detect_environment(ours | {"SHARDKIT_NUM_PROCESSES": "x"})
    # rows of a global batch: any split gives back the batch (what each process loads)
    ids = tmp_path / "ids.npy"
    np.save(ids, np.arange(500, dtype=np.int32) % 13)
    for data in (ReverseTask(digits=7, length=4), TokenFile(path=str(ids), seq_len=8),
                 TeacherTask(features=6, classes=3)):  # fmt: skip
        whole = data.batch(3, batch_size=8)
        parts = [data.batch(3, batch_size=8, rows=np.arange(i, i + 2)) for i in (0, 2, 4, 6)]
        for key, value in whole.items():
            np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), value)
