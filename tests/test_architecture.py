"""shardkit's import graph, read from the source (function-local imports included).

The design: modules import one way (mesh -> rules/lint -> strategies -> train -> inspection;
kernels, models and the pipeline stand alone; ``shardkit.common``, ``leaves``, ``errors`` and
``compat`` sit below everything). An import hidden inside a function still counts here: a cycle
it closes is a helper in the wrong place.
"""

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in (SRC / "shardkit").rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imports(mods: dict[str, pathlib.Path]) -> list[tuple[str, str, str, int]]:
    """(importer, imported module, imported name or "", line) for every shardkit import."""
    found = []
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                raise AssertionError(f"{path}:{node.lineno}: relative import; write shardkit.…")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("shardkit"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    if sub in mods:  # from shardkit.pkg import submodule
                        found.append((mod, sub, "", node.lineno))
                    else:
                        found.append((mod, node.module, alias.name, node.lineno))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("shardkit"):
                        found.append((mod, alias.name, "", node.lineno))
    return found


def graph(mods) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for src, dst, _, _ in imports(mods):
        while dst not in mods:
            dst = dst.rpartition(".")[0]
        # a package's __init__ re-exporting its own submodules is not a cycle
        if dst != src and not (mods[src].name == "__init__.py" and dst.startswith(src + ".")):
            edges[src].add(dst)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_modules():
    assert cycles(graph(modules())) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_another_modules_private_name():
    private = [
        f"{src}:{line} imports {name} from {dst}"
        for src, dst, name, line in imports(modules())
        if name.startswith("_") and not name.startswith("__")
    ]
    assert private == []


@pytest.mark.parametrize(
    "module, allowed",
    [("shardkit.common", ()), ("shardkit.errors", ()), ("shardkit.compat", ()),
     ("shardkit.placement", ("shardkit.errors",))],  # its errors, with a fix, like the others
)  # fmt: skip
def test_the_bottom_modules_import_nothing_from_shardkit(module, allowed):
    mods = modules()
    assert [dst for src, dst, _, _ in imports(mods) if src == module and dst not in allowed] == []


def test_every_shardkit_error_derives_from_shardkit_error():
    import importlib
    import inspect

    import shardkit
    from shardkit.errors import ShardkitError

    found = []
    for name in modules():
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__.startswith("shardkit"):
                found.append(cls)
    assert len(found) > 20  # the walk saw the package's errors
    assert [c.__qualname__ for c in found if not issubclass(c, ShardkitError)] == []
    assert shardkit.ShardkitError is ShardkitError


def test_one_class_per_name():
    import importlib
    import inspect
    import warnings

    by_name: dict[str, set] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the moved modules' aliases
        for name in modules():
            for _, cls in inspect.getmembers(importlib.import_module(name), inspect.isclass):
                if cls.__module__.startswith("shardkit") and not cls.__name__.startswith("_"):
                    by_name.setdefault(cls.__name__, set()).add(f"{cls.__module__}.{cls.__name__}")
    assert len(by_name) > 50
    assert {n: sorted(cs) for n, cs in by_name.items() if len(cs) > 1} == {}


@pytest.mark.parametrize(
    "module,old,new",
    [("shardkit.matmul", "Collective", "MatmulCollective"),
     ("shardkit.linter", "Finding", "LintFinding")],
)  # fmt: skip
def test_renamed_classes_keep_their_old_name_for_a_release(module, old, new):
    import importlib

    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=new):
        assert getattr(mod, old) is getattr(mod, new)


# Layers, lowest first: a module may import its own package and lower layers only. The
# application modules (the `shardkit` command, each `command` module and `shardkit train`'s
# run) sit on top of everything.
LAYERS = [
    {"common", "errors", "compat", "cli_args", "placement", "rings"},
    {"leaves", "mesh", "collectives", "overlap"},
    {"linter", "models", "pipeline", "fft", "linalg", "matmul", "distributed"},
    {"rules", "layout"},
    {"plan"},  # beside the others and pure: no JAX, no train, inspection or verify
    {"strategies"},  # `Auto` asks the planner
    {"train"},
    {"inspection"},
    {"verify"},  # compiles real steps to check the planner: may import all of them
]
# the `shardkit train` program (its audit and summary live beside its body, which they serve)
APPLICATION = ("shardkit.cli", "shardkit.train.run", "shardkit.train.step_audit",
               "shardkit.__init__")  # fmt: skip
# The planner's conveniences into the layers above it (`Plan.verify`, a row's `strategy()`,
# both imported on call) and the deprecated
# aliases of the modules that moved to shardkit.verify (they go in the next release).
UPWARD = {
    ("shardkit.plan.search", "shardkit.verify"),
    ("shardkit.plan.cost", "shardkit.strategies.core"),  # Candidate.strategy(), on call
    ("shardkit.plan.pipe", "shardkit.strategies.core"),
    ("shardkit.plan.pipe", "shardkit.strategies.pipeline"),
    ("shardkit.plan.measure", "shardkit.verify.measurement"),
    ("shardkit.plan.verify", "shardkit.verify.compare"),
}


def rank(module: str) -> int:
    if module in APPLICATION or module == "shardkit" or module.endswith(".command"):
        return len(LAYERS)
    package = module.split(".")[1]
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def test_every_package_has_a_layer():
    packages = {m.split(".")[1] for m in modules() if m.count(".") >= 1}
    placed = set().union(*LAYERS) | {"cli", "__init__"}
    assert packages - placed == set()


def test_imports_go_down_the_layers():
    up = []
    for src, dst, _, line in imports(modules()):
        same = src.split(".")[:2] == dst.split(".")[:2]
        if not same and rank(src) < rank(dst) and (src, dst) not in UPWARD:
            up.append(f"{src}:{line} imports {dst}")
    assert up == []


def test_the_layer_check_sees_an_upward_import():
    assert rank("shardkit.mesh") < rank("shardkit.train.trainer") < rank("shardkit.verify.compare")
    assert rank("shardkit.plan.command") == rank("shardkit.train.run") == len(LAYERS)


def test_the_planner_is_pure():
    # no Trainer, no audit of compiled programs: those are shardkit.verify's
    found = [
        f"{src}:{line} imports {dst}"
        for src, dst, _, line in imports(modules())
        if src.startswith("shardkit.plan")
        and dst.startswith(("shardkit.train", "shardkit.inspection", "shardkit.verify"))
        and (src, dst) not in UPWARD
    ]
    assert found == []


def test_shardkit_raises_its_own_errors():
    # every error a user can catch with `except shardkit.ShardkitError`: no bare built-ins
    # (AssertionError stays for internal invariants, like `assert`)
    builtin = {"ValueError", "TypeError", "RuntimeError", "Exception"}
    bare = []
    for mod, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                func = node.exc.func
                if isinstance(func, ast.Name) and func.id in builtin:
                    bare.append(f"{mod}:{node.lineno} raises {func.id}")
    assert bare == []


@pytest.mark.parametrize("old,new", [("measure", "measurement"), ("verify", "compare")])
def test_the_moved_planner_modules_still_import_and_warn(old, new):
    import subprocess
    import sys

    code = (
        "import warnings, importlib\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        f"    a = importlib.import_module('shardkit.plan.{old}')\n"
        f"b = importlib.import_module('shardkit.verify.{new}')\n"
        "assert a is b, (a, b)\n"
        "assert any(issubclass(x.category, DeprecationWarning) and 'shardkit.verify' in "
        "str(x.message) for x in w), [str(x.message) for x in w]\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


def test_functions_and_modules_stay_readable():
    # a function a reader can hold in their head; a module of one concept
    long_functions, long_modules = [], []
    for mod, path in modules().items():
        text = path.read_text()
        if len(text.splitlines()) > 600:
            long_modules.append(f"{mod}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 100:
                    long_functions.append(f"{mod}.{node.name}: {n} lines")
    assert long_functions == [] and long_modules == []


def test_every_import_inside_a_function_says_why():
    # imports belong at the top; one that stays in a function (laziness for --help, JAX kept
    # out of the planner) carries its reason in a comment on its line or the line above
    silent = []
    for mod, path in modules().items():
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("shardkit"):
                    here, above = lines[node.lineno - 1], lines[node.lineno - 2]
                    if "#" not in here and not above.strip().startswith("#"):
                        silent.append(f"{mod}:{node.lineno}")
    assert silent == []
