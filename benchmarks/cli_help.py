"""How long `shardkit --help` takes (target: under 1 s), next to `python -c pass` and
`python -c "import jax"` measured in the same run, so the ratio shows what lazy imports save.

Run: .venv/bin/python benchmarks/cli_help.py
"""

import os
import statistics
import subprocess
import sys
import time

RUNS = 5


def _time(argv: list[str]) -> float:
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    exe = os.path.join(os.path.dirname(sys.executable), "shardkit")
    base = _time([sys.executable, "-c", "pass"])
    jax_import = _time([sys.executable, "-c", "import jax"])
    help_t = _time([exe, "--help"])
    show_help = _time([exe, "show", "--help"])
    print(f"python -c pass        {base * 1e3:8.1f} ms")
    print(f"python -c 'import jax' {jax_import * 1e3:7.1f} ms")
    print(f"shardkit --help       {help_t * 1e3:8.1f} ms  ({help_t / jax_import:.2f}x import jax)")
    print(f"shardkit show --help  {show_help * 1e3:8.1f} ms")
    print(f"target --help < 1 s: {'met' if help_t < 1.0 else 'NOT met'}")


if __name__ == "__main__":
    main()
