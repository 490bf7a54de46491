"""The guides run as a reader pastes them: every ```python block of README.md and docs/*.md, in
order, in one fresh Python per file (no devices forced from outside: a guide that needs 8 says
so itself). A block preceded by `<!-- not run: reason -->` (a multi-process, SLURM or TPU
block, a test-file fragment) is skipped for that reason. Relative links point at real files.

A fenced block of `>>> ` lines, each followed by the output it gives, is checked like a
doctest: every `>>>` statement runs (after `import shardkit as sk`, on 8 simulated CPU
devices) and what it prints, plus the repr of its value or `Type: message` of the exception it
raises, must match the lines below it (`...` elides, line breaks are spaces).
"""

import doctest
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


def clean_env() -> dict[str, str]:
    """The environment a reader's fresh shell has: no forced devices, no shardkit settings."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS" and not k.startswith("SHARDKIT")}
    env["MPLBACKEND"] = "Agg"
    return env


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
    out = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(run), text=True,
                         capture_output=True, env=clean_env(), cwd=tmp_path,
                         timeout=600)  # fmt: skip
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


# -- `>>>` blocks: statements and the output they give -----------------------------------------
_FENCED = re.compile(r"^```[^\n]*\n(?P<body>.*?)^```", re.S | re.M)


def examples(path: pathlib.Path) -> list[tuple[int, str, str]]:
    """(line number, statement, expected output) of every `>>> ` line of a fenced block.

    A statement continues on the `... ` lines right after it; its output is the lines after
    that up to a blank line or the next `>>> `.
    """
    text = path.read_text()
    found = []
    for m in _FENCED.finditer(text):
        first = text.count("\n", 0, m.start("body")) + 1
        lines = m["body"].splitlines()
        i = 0
        while i < len(lines):
            if not lines[i].startswith(">>> "):
                i += 1
                continue
            line, source = first + i, [lines[i][4:]]
            i += 1
            while i < len(lines) and lines[i].startswith("... "):
                source.append(lines[i][4:])
                i += 1
            want = []
            while i < len(lines) and lines[i].strip() and not lines[i].startswith(">>> "):
                want.append(lines[i])
                i += 1
            found.append((line, "\n".join(source), "\n".join(want)))
    return found


EXAMPLES_DRIVER = textwrap.dedent(
    """
    import contextlib, io, json, sys
    import shardkit as sk
    sk.simulate_cpu_devices(8)
    scope = {"__name__": "__main__", "sk": sk}
    results = []
    for source in json.loads(sys.stdin.read()):
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                try:
                    code = compile(source, "<example>", "eval")
                except SyntaxError:
                    exec(compile(source, "<example>", "exec"), scope)
                    value = None
                else:
                    value = eval(code, scope)
            got = printed.getvalue() + ("" if value is None else repr(value))
        except Exception as e:
            got = printed.getvalue() + f"{type(e).__name__}: {e}"
        results.append(got)
    print("EXAMPLES", json.dumps(results))
    """
)
_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def run_examples(path: pathlib.Path, cwd: pathlib.Path) -> list[str]:
    """What each `>>>` statement of the guide gives, run in order in one fresh Python."""
    import json

    sources = [source for _, source, _ in examples(path)]
    out = subprocess.run([sys.executable, "-c", EXAMPLES_DRIVER], input=json.dumps(sources),
                         text=True, capture_output=True, env=clean_env(), cwd=cwd,
                         timeout=600)  # fmt: skip
    last = out.stdout.strip().splitlines()[-1:] or [""]
    assert out.returncode == 0 and last[0].startswith("EXAMPLES "), (
        f"{path.name}: " + out.stdout[-3000:] + out.stderr[-2000:]
    )
    return json.loads(last[0][len("EXAMPLES ") :])


def mismatches(path: pathlib.Path, got: list[str]) -> list[str]:
    """One report per `>>>` statement whose output differs from the guide's text."""
    checker, bad = doctest.OutputChecker(), []
    for (line, source, want), actual in zip(examples(path), got, strict=True):
        if not checker.check_output(want + "\n", actual + "\n", _FLAGS):
            example = doctest.Example(source, want + "\n", lineno=line)
            diff = checker.output_difference(example, actual + "\n", _FLAGS)
            bad.append(f"{path.name}:{line}: >>> {source}\n{diff}")
    return bad


@pytest.mark.parametrize("path", [p for p in GUIDES if examples(p)], ids=lambda p: p.name)
def test_every_interactive_example_gives_the_output_the_guide_shows(path, tmp_path):
    bad = mismatches(path, run_examples(path, tmp_path))
    assert not bad, "\n".join(bad)


def test_interactive_examples_are_found_and_a_changed_figure_fails(tmp_path):
    found = examples(ROOT / "docs" / "plan.md")
    assert sum(bool(want) for _, _, want in found) >= 6, found  # errors, ranks
    line, source, want = next(e for e in found if "DoesNotFitError" in e[2])
    assert source == 'sk.plan("llama3-405b", devices=8, hardware="h100", batch=8)'
    # the same statement, checked against its text with one figure changed, fails
    guide = tmp_path / "guide.md"
    guide.write_text(f"```\n>>> {source}\n{want.replace('790.5 GiB', '790.6 GiB', 1)}\n```\n")
    assert mismatches(guide, run_examples(guide, tmp_path)), "a changed figure went unnoticed"
