"""The house's shape (docs/architecture.md, "Floors"): every import of libinject/ and
nvhook/ points down a floor or stays on its own, the import graph has no circle, and no
module is over 1,000 lines. Imports are read with ast, without importing anything: at
module level and inside functions alike (a function-level import is a dependency too,
only a later one), and those under `if TYPE_CHECKING:` as well (a type is one)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("libinject", "nvhook")
MAX_LINES = 1000
LINE_CHECKED = ("libinject", "nvhook", "packaging", "bench")

# Each floor may import its own and those below it, never one above. The longest prefix
# names a module's floor. Keep in step with docs/architecture.md's table.
FLOORS: dict[str, int] = {
    # 0: what everything uses and that uses nothing of ours
    "libinject": 0, "libinject.errors": 0, "libinject.constants": 0, "libinject.record": 0,
    "libinject.jsonc": 0, "libinject.tomlfast": 0, "libinject.installpath": 0,
    # 1: the thin OS layer
    "libinject.linux": 1,
    # 2: host keys and the logger (over the OS layer)
    "libinject.hostkey": 2, "libinject.log": 2,
    # 3-6: the pipeline's stages, in order
    "libinject.request": 3,
    "libinject.discover": 4,
    "libinject.plan": 5,
    "libinject.apply": 6,
    # 7: the stages as one call, and the config that picks their options
    "libinject.pipeline": 7, "libinject.config": 7,
    # 8: how runtimes reach the pipeline (the hook, the service, the shim)
    "libinject.runtime": 8,
    # 9: putting nvhook on a node, simulated hosts
    "libinject.setup": 9, "libinject.sim": 9,
    # 10: the command line
    "nvhook": 10,
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    """The module of ours that importing `name` runs (its nearest one: a package's
    __init__ for a name in it that is not a module, e.g. a C extension)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _module_level(tree: ast.Module) -> list[ast.AST]:
    """The statements run when the module is imported (not those in functions or classes)."""
    out, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        out.append(node)
        for name in ("body", "orelse", "handlers", "finalbody"):
            todo += getattr(node, name, None) or []
    return out


def _imports(mod: str, path: Path, mods: dict[str, Path], *, module_level: bool = False) -> dict[str, int]:
    """{module of ours it imports: the first line doing so} (module_level: only the
    imports made when it is imported)."""
    tree = ast.parse(path.read_text(), str(path))
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in (_module_level(tree) if module_level else ast.walk(tree)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package
                for _ in range(node.level - 1):
                    up = up.rpartition(".")[0]
                base = f"{up}.{base}" if base else up
            # `from pkg import mod` imports pkg.mod; `from mod import name` only mod
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
        for name in names:
            target = _resolve(name, mods)
            # (a package's parents run first, but ours do nothing: not an edge)
            if target and target != mod and target not in PACKAGES:
                found.setdefault(target, node.lineno)
    return found


def _graph() -> tuple[dict[str, Path], dict[str, dict[str, int]]]:
    mods = _modules()
    return mods, {m: _imports(m, p, mods) for m, p in mods.items()}


def floor(mod: str) -> int:
    name = mod
    while name not in FLOORS:
        assert "." in name, f"{mod}: no floor (add it to FLOORS and docs/architecture.md)"
        name = name.rpartition(".")[0]
    return FLOORS[name]


def _circles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    scc = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        scc.append(w)
                        if w == v:
                            break
                    if len(scc) > 1:
                        out.append(sorted(scc))
    return out


def test_the_graph_is_read():
    """The reader sees what the test relies on: function-level, relative and
    TYPE_CHECKING imports (the checks below would pass vacuously on an empty graph)."""
    mods, edges = _graph()
    assert len(mods) > 100
    # function-level: the hook dispatches `cdi-hook` inside parse_argv
    assert "libinject.runtime.cdi_hooks" in edges["libinject.runtime.hook"]
    # module-level `from pkg import module`
    assert "libinject.discover.snapshot" in edges["libinject.discover.driver"]
    assert "nvhook.cli" in edges["nvhook.__main__"]


def test_circles_are_found():
    assert _circles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b": 1}, "b": {}}) == []


def test_no_import_circle():
    _, edges = _graph()
    circles = _circles(edges)
    lines = []
    for scc in circles:
        lines.append(" <-> ".join(scc))
        lines += [f"    {a} -> {b} (line {edges[a][b]})" for a in scc for b in sorted(edges[a]) if b in scc]
    assert not circles, "import circles:\n" + "\n".join(lines)


def test_every_module_has_a_floor():
    mods, _ = _graph()
    for mod in mods:
        floor(mod)


def test_no_import_up_a_floor():
    mods, edges = _graph()
    up = [f"{a} (floor {floor(a)}) -> {b} (floor {floor(b)}), line {line}"
          for a in sorted(edges) for b, line in sorted(edges[a].items()) if floor(b) > floor(a)]
    assert not up, "imports up a floor:\n" + "\n".join(up)


def test_no_module_over_1000_lines():
    big = []
    for top in LINE_CHECKED:
        for path in sorted((ROOT / top).rglob("*.py")):
            n = path.read_bytes().count(b"\n")
            if n > MAX_LINES:
                big.append(f"{path.relative_to(ROOT)}: {n} lines")
    assert not big, "modules over 1,000 lines:\n" + "\n".join(big)


def _live_apply_calls(path: Path) -> list[int]:
    """Lines of `path` that call the live applier: live.apply(...) on the module, or
    the `apply` name imported from it."""
    tree = ast.parse(path.read_text(), str(path))
    names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
             and n.module == "libinject.apply.live" for a in n.names if a.name == "apply"}
    out = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        f = n.func
        if (isinstance(f, ast.Attribute) and f.attr == "apply" and isinstance(f.value, ast.Name)
                and f.value.id == "live") or (isinstance(f, ast.Name) and f.id in names):
            out.append(n.lineno)
    return out


def test_one_pipeline():
    """Every path that changes a live container (the prestart hook, `nvhook configure`,
    the CDI spec's hook, served or exec'd) reaches the live applier through the
    pipeline's apply stage (libinject.pipeline.apply), and both hooks plan through the
    pipeline: nothing else calls live.apply."""
    mods, edges = _graph()
    callers = {mod: lines for mod, path in mods.items()
               if not mod.startswith("libinject.apply") and (lines := _live_apply_calls(path))}
    assert set(callers) == {"libinject.pipeline"}, callers
    assert "libinject.pipeline" in edges["libinject.runtime.hook"]
    assert "libinject.pipeline" in edges["libinject.runtime.cdi_hooks"]
    # the CDI hook's own request and plan stages, on their floors
    assert {"libinject.request.cdi_hook", "libinject.plan.cdi_hook",
            "libinject.discover.procfs"} <= set(edges["libinject.pipeline"])
    assert "libinject.apply.live" not in edges["libinject.runtime.cdi_hooks"]


def test_the_docs_floor_table_is_this_one():
    """docs/architecture.md's table names the floors this test checks."""
    text = (ROOT / "docs/architecture.md").read_text()
    table = text.split("## Floors", 1)[1].split("\n## ", 1)[0]
    for name, n in FLOORS.items():
        row = next((line for line in table.splitlines() if line.startswith(f"| {n} |")), None)
        assert row is not None, f"floor {n} has no row in docs/architecture.md"
        shown = name.replace(".", "/") if name != "libinject" else "libinject/__init__"
        assert f"`{shown}" in row, f"{name} is not in floor {n}'s row: {row}"


def test_the_service_preloads_every_module_a_served_start_imports():
    """`nvhook serve` imports PRELOAD before it forks (a worker must never import after
    the fork): each name of ours there is a module, and no module those import (at
    module level, transitively) imports one of ours inside a function that is not
    among them. A module moved or split keeps this true only if PRELOAD follows."""
    from libinject.runtime.serve.preload import PRELOAD

    mods = _modules()
    ours = [name for name in PRELOAD if name.split(".")[0] in PACKAGES]
    assert [name for name in ours if name not in mods] == []
    loaded: set[str] = set()
    todo = list(ours)
    while todo:
        mod = todo.pop()
        if mod not in loaded:
            loaded.add(mod)
            todo += _imports(mod, mods[mod], mods, module_level=True)
    late = [f"{mod} -> {target} (line {line})" for mod in sorted(loaded)
            for target, line in sorted(_imports(mod, mods[mod], mods).items()) if target not in loaded]
    assert not late, "imported after a fork by a served start:\n" + "\n".join(late)
