"""The README's tour runs as written and prints what it promises."""

import os
import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_tour_runs(tmp_path):
    text = README.read_text()
    tour = text[text.index("## A short tour") :]
    code = re.search(r"```python\n(.*?)```", tour, re.S).group(1)
    script = tmp_path / "tour.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "lint: 3 leaves" in out.stdout and "0 errors" in out.stdout
    assert "folded unsharded dims B" in out.stdout
    line = 1 + code.splitlines().index(
        next(ln for ln in code.splitlines() if "sk.inspect(jnp.fft.fftn" in ln)
    )
    assert "all-gather" in out.stdout and f"tour.py:{line}" in out.stdout  # the user's line
    assert "chosen: collective" in out.stdout
