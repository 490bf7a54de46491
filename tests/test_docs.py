"""The guides run as a reader pastes them: every ```python block of README.md and docs/*.md, in
order, in one fresh Python per file (no devices forced from outside: a guide that needs 8 says
so itself). A block preceded by `<!-- not run: reason -->` (a multi-process, SLURM or TPU
block, a test-file fragment) is skipped for that reason. Relative links point at real files.
"""

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
GUIDES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"(?:<!--\s*not run:\s*(?P<why>.*?)\s*-->\s*\n)?```python\n(?P<code>.*?)```",
                    re.S)  # fmt: skip


# runs the blocks one by one in one namespace; names the block that fails and why
def blocks(path: pathlib.Path) -> list[tuple[int, str, str | None]]:
    return [(i, m["code"], m["why"]) for i, m in enumerate(_BLOCK.finditer(path.read_text()))]


DRIVER = textwrap.dedent(
    """
    import json, sys, traceback
    blocks = json.loads(sys.stdin.read())
    scope = {"__name__": "__main__"}
    for i, code in blocks:
        try:
            exec(compile(code, f"<block {i}>", "exec"), scope)
        except BaseException as e:
            tb = traceback.format_exc().splitlines()[-6:]
            print(f"BLOCK {i} FAILED: {type(e).__name__}: {e}", *tb, sep="\\n")
            sys.exit(1)
    print("ALL BLOCKS RAN")
    """
)


@pytest.mark.parametrize(
    "path", [p for p in GUIDES if any(w is None for _, _, w in blocks(p))], ids=lambda p: p.name
)
def test_every_python_block_of_the_guide_runs_as_pasted(path, tmp_path):
    import json

    run = [(i, code) for i, code, why in blocks(path) if why is None]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS" and not k.startswith("SHARDKIT")}
    env["MPLBACKEND"] = "Agg"
    out = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(run), text=True,
                         capture_output=True, env=env, cwd=tmp_path, timeout=600)  # fmt: skip
    assert out.returncode == 0 and "ALL BLOCKS RAN" in out.stdout, (
        f"{path.name}: " + out.stdout[-3000:] + out.stderr[-2000:]
    )


def test_skipped_blocks_say_why():
    for path in GUIDES:
        for i, _, why in blocks(path):
            assert why is None or len(why) > 10, (path.name, i, why)


@pytest.mark.parametrize("path", GUIDES, ids=lambda p: p.name)
def test_relative_links_point_at_real_files(path):
    dead = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        if not (path.parent / target).exists():
            dead.append(target)
    assert not dead, (path.name, dead)
