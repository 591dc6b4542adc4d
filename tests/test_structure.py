"""The code's shape, checked from its source (no torch needed): no import cycle, no long
function, argparse only in the CLI, planning never imports torch.

Imports are read with ``ast``: every import at any level (module top, inside functions:
lazy imports count, since they run), relative and absolute. ``from pkg import name``
is an edge to ``pkg.name`` when that is a module, else to ``pkg`` (the package
``__init__`` that defines ``name``).
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "partita"
MAX_FUNCTION_LINES = 80  # DESIGN.md: "no function over 80 lines"

# Cycles known at the time of writing, each as the sorted tuple of its modules (or
# packages), in files owned by other engineers; the lead empties this list once they are
# gone (each is dodged today by a lazy import inside a function).
KNOWN_CYCLES: list[tuple[str, ...]] = [
]

# Functions (module:qualified name) over the limit in files owned by others; the lead
# empties this list once they are split.
KNOWN_LONG_FUNCTIONS: list[str] = []

# Files outside cli/ allowed to import argparse, each with its reason; the lead empties it.
ARGPARSE_EXCEPTIONS: dict[str, str] = {
    # reads other frameworks' launch command lines (Megatron/MindSpeed flags) into a Plan:
    # argparse is the parser of the foreign format here, not a command of ours
    "src/partita/imports/megatron.py": "parses Megatron-LM / MindSpeed-LLM command lines",
    "src/partita/imports/megatron_model.py": "parses the model flags of Megatron-LM / MindSpeed-LLM command lines",
}

PLANNING = ("partita.spec", "partita.cost", "partita.search", "partita.plan", "partita.estimate",
            "partita.export", "partita.imports", "partita.serve")
HEAVY = ("torch", "torch_npu", "numpy", "transformers", "deepspeed")


def module_files() -> dict[str, Path]:
    """Module name -> file, for every module of the package (packages by their __init__)."""
    out = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = module_files()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def imported_names(name: str) -> list[tuple[str, int]]:
    """Every module name ``name`` imports (absolute, with the line), at any nesting level."""
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    package = name if _is_package(name) else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            subs = [f"{target}.{alias.name}" for alias in node.names]
            if not all(sub in MODULES for sub in subs):  # a name defined in ``target`` itself
                found.append((target, node.lineno))
            found += [(sub, node.lineno) for sub in subs]
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported package module: line}; only modules of the package."""
    graph: dict[str, dict[str, int]] = {}
    for name in MODULES:
        edges: dict[str, int] = {}
        for target, line in imported_names(name):
            if target in MODULES and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as one
    cycle through them, in import order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for v in graph:
        if v not in index:
            visit(v)
    return [_one_cycle(graph, set(comp)) for comp in components]


def _one_cycle(graph: dict[str, dict[str, int]], comp: set[str]) -> list[str]:
    """A shortest import path from the component's first module back to itself."""
    start = min(comp)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in graph[v]:
            if w == start:
                return paths[v] + [start]
            if w in comp and w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    return sorted(comp)


def describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def test_the_graph_sees_lazy_and_relative_imports():
    # the checker itself: cli imports the library lazily inside functions, relatively
    graph = import_graph()
    assert "partita.search.engine" in graph["partita.cli.plan"]  # inside cmd_plan's helper
    assert "partita.train.resolve" in graph["partita.cli.train"]  # inside run_train
    assert "partita.errors" in graph["partita.plan"]
    assert find_cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c", "a"]]


def test_no_import_cycle():
    graph = import_graph()
    cycles = find_cycles(graph)
    unexpected = [c for c in cycles if tuple(sorted(set(c))) not in KNOWN_CYCLES]
    assert not unexpected, "import cycles:\n" + "\n".join(describe(c, graph) for c in unexpected)


def package_graph(graph: dict[str, dict[str, int]]) -> dict[str, dict[str, str]]:
    """The import graph between the top-level parts (``partita.runtime``, ``partita.train``,
    ``partita.plan``, ...): a cycle here (runtime -> train -> runtime) tangles two layers
    even when no single module cycle exists."""
    def part(module: str) -> str:
        return ".".join(module.split(".")[:2])
    out: dict[str, dict[str, str]] = {}
    for module, edges in graph.items():
        node = out.setdefault(part(module), {})
        for target, line in edges.items():
            if part(target) != part(module) and part(target) != PACKAGE:
                node.setdefault(part(target), f"{module} line {line} imports {target}")
    for node in list(out.values()):
        for target in node:
            out.setdefault(target, {})
    return out


def test_no_import_cycle_between_packages():
    graph = package_graph(import_graph())
    cycles = find_cycles(graph)
    unexpected = [c for c in cycles if tuple(sorted(set(c))) not in KNOWN_CYCLES]
    assert not unexpected, "import cycles between packages:\n" + "\n".join(
        " -> ".join(c) + ": " + "; ".join(graph[a][b] for a, b in zip(c, c[1:])) for c in unexpected)


def test_the_library_never_imports_the_cli():
    graph = import_graph()
    library = [m for m in graph if not m.startswith("partita.cli") and m != "partita.__main__"]  # entry point
    offenders = [f"{m} imports {t} (line {line})" for m in library for t, line in graph[m].items() if t == "partita.cli" or t.startswith("partita.cli.")]
    assert not offenders, "\n".join(offenders)


def long_functions() -> list[str]:
    out = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))

        def walk(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = child.end_lineno - child.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        out.append(f"{name}:{prefix}{child.name} ({lines} lines, {path.relative_to(SRC)}:{child.lineno})")
                    walk(child, f"{prefix}{child.name}.")
                elif isinstance(child, ast.ClassDef):
                    walk(child, f"{prefix}{child.name}.")
                else:
                    walk(child, prefix)
        walk(tree, "")
    return out


def test_no_function_over_80_lines():
    offenders = [f for f in long_functions() if f.split(" (")[0] not in KNOWN_LONG_FUNCTIONS]
    assert not offenders, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(offenders)


def test_argparse_only_in_the_cli():
    offenders = []
    for name in MODULES:
        if name == "partita.cli" or name.startswith("partita.cli."):
            continue
        rel = str(MODULES[name].relative_to(SRC.parent))
        if any(t == "argparse" or t.startswith("argparse.") for t, _ in imported_names(name)) \
                and rel not in ARGPARSE_EXCEPTIONS:
            offenders.append(rel)
    assert not offenders, "argparse outside src/partita/cli/: " + ", ".join(offenders)


def _closure(graph: dict[str, dict[str, int]], roots: list[str]) -> dict[str, list[str]]:
    """Every module reachable from ``roots``, with one import path to it."""
    paths = {r: [r] for r in roots}
    todo = list(roots)
    while todo:
        v = todo.pop()
        for w in graph[v]:
            if w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    return paths


def test_planning_never_imports_torch_even_lazily():
    graph = import_graph()
    roots = [m for m in MODULES if any(m == p or m.startswith(p + ".") for p in PLANNING)]
    offenders = []
    for module, path in _closure(graph, roots).items():
        for target, line in imported_names(module):
            if target.split(".")[0] in HEAVY:
                offenders.append(f"{' -> '.join(path)} imports {target} (line {line})")
    assert not offenders, "\n".join(offenders)


LIGHT_ENTRY_POINTS = ("partita", "partita.cli", "partita.cli.plan", "partita.cli.estimate", "partita.cli.export",
                      "partita.cli.models", "partita.cli.hardware", "partita.cli.train", "partita.cli.profile",
                      "partita.train.config", *PLANNING)


def test_importing_planning_code_loads_no_torch():
    # one interpreter imports them in turn and names the first that loaded a heavy package
    code = ("import sys, importlib\n"
            f"for m in {LIGHT_ENTRY_POINTS!r}:\n"
            "    importlib.import_module(m)\n"
            f"    heavy = sorted(h for h in {HEAVY!r} if h in sys.modules)\n"
            "    if heavy:\n"
            "        sys.exit(f'importing {m} loaded {heavy}')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr


# ------------------------------------------------------------------ plan flags from Plan (issue 31 item 2)
PLAN_FLAG_SOURCES = ("cli", "train/config.py")  # where flags are declared


def _literal_choices(path: Path) -> list[tuple[int, frozenset]]:
    """(line, values) of every ``choices=`` given as a literal list/tuple/set in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.keyword) and node.arg == "choices" \
                and isinstance(node.value, (ast.List, ast.Tuple, ast.Set)):
            try:
                out.append((node.value.lineno, frozenset(str(v) for v in ast.literal_eval(node.value))))
            except ValueError:
                continue
    return out


def test_plan_flags_are_generated_from_plan():
    """Every Plan field carries its flag metadata (plan._flag: flag, allowed values or bounds,
    help, commands), each appears in the --help of the commands it names, and no flag
    declaration types a field's allowed values again (they drifted: --dtype, --zero,
    --recompute, --schedule, --grad-dtype in cli/*.py and train/config.py)."""
    import dataclasses

    from partita import plan
    from partita.cli.main import build_parser
    plan_fields = dataclasses.fields(plan.Plan)
    bare = [f.name for f in plan_fields if "commands" not in f.metadata or "estimate" not in f.metadata["commands"]]
    assert not bare, f"Plan fields without flag metadata (plan._flag) or not offered by estimate: {bare}"
    flag_name = plan.flag_name
    value_sets = {frozenset(str(c) for c in f.metadata["choices"]): f.name for f in plan_fields
                  if f.metadata["choices"]}
    retyped = [f"{path.relative_to(SRC)}:{line}: choices= repeats Plan.{value_sets[values]}'s values"
               for where in PLAN_FLAG_SOURCES for path in sorted((SRC / PACKAGE / where).rglob("*.py")
                                                                   if (SRC / PACKAGE / where).is_dir()
                                                                   else [SRC / PACKAGE / where])
               for line, values in _literal_choices(path) if values in value_sets]
    assert not retyped, "import the allowed values from partita.plan (or generate the flag):\n" + "\n".join(retyped)
    sub = next(a for a in build_parser()._actions if a.choices and "estimate" in a.choices).choices
    for command in ("estimate", "plan"):
        offered = {opt for action in sub[command]._actions for opt in action.option_strings}
        missing = [flag_name(f.name) for f in plan_fields
                   if command in f.metadata["commands"] and flag_name(f.name) not in offered]
        assert not missing, f"partita {command} lacks the flags of its Plan fields: {missing}"


def _target_name_literals(path: Path, names: frozenset[str]) -> list[int]:
    """Lines of ``path`` where a literal list, tuple, set or dict (its keys) holds exactly the
    export target names: a second list of the targets, which drifts from the registry."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        items = node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(
            node, (ast.List, ast.Tuple, ast.Set)) else None
        strings = {i.value for i in items or () if isinstance(i, ast.Constant) and isinstance(i.value, str)}
        if strings == names:
            lines.append(node.lineno)
    return lines


def test_one_list_of_export_targets():
    """The export targets are listed once, in partita.export.registry: no other module spells
    their names as a literal collection (they were typed four times: the dispatcher, export --to,
    plan --export, import --from)."""
    from partita.export.registry import TARGETS
    names = frozenset(t.name for t in TARGETS)
    assert len(names) >= 4
    registry = MODULES["partita.export.registry"]
    listed = [f"{path.relative_to(SRC)}:{line}" for name, path in MODULES.items() if path != registry
              for line in _target_name_literals(path, names)]
    assert not listed, "read the targets from partita.export.registry instead of listing them:\n" + "\n".join(listed)

# Issue 31: one module turns a model name into a model. The names it knows and the tables
# that hold them; a comparison against them, or an ``is_hf`` test, anywhere else is a second
# resolver that will drift (a config-only HF directory once trained as one model and was
# planned as another).
NAME_RESOLVER = "partita.models.registry"
MODEL_NAME_TABLES = {"TINY", "TINY_HF", "TINY_HF_MOE", "TINY_MOE", "MODEL_PRESETS"}


def _registry_names() -> set[str]:
    """The reference model names and the keys of every name table (read from the source,
    wherever a table is defined)."""
    names = {"tiny-llama", "tiny-moe", "small-llama"}
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict) \
                    and any(isinstance(t, ast.Name) and t.id in MODEL_NAME_TABLES for t in targets):
                names |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    return names


def model_name_branches() -> list[str]:
    """Every ``is_hf``, comparison with a model name or name table, and ``.startswith`` of
    a model-name prefix outside the registry."""
    names = _registry_names()
    prefixes = {n.split("-")[0] + "-" for n in names}

    def named(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names or node.value in prefixes
        return (node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)) in MODEL_NAME_TABLES
    out = []
    for module, path in MODULES.items():
        if module == NAME_RESOLVER:
            continue
        where = path.relative_to(SRC)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Name, ast.Attribute, ast.FunctionDef, ast.alias)) and "is_hf" in (
                    getattr(node, "id", None) or getattr(node, "attr", None) or getattr(node, "name", "") or ""):
                out.append(f"{where}:{node.lineno}: is_hf")
            elif isinstance(node, ast.Compare) and any(map(named, [node.left, *node.comparators])):
                out.append(f"{where}:{node.lineno}: compares with a model name or name table")
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "startswith" \
                    and any(map(named, node.args)):
                out.append(f"{where}:{node.lineno}: tests a model-name prefix")
    return sorted(set(out))


def test_one_module_resolves_model_names():
    offenders = model_name_branches()
    assert not offenders, f"model names are resolved only in {NAME_RESOLVER} (resolve_model, family_of):\n" + \
        "\n".join(offenders)

