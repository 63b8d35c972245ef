"""The layout rules of the project, checked on its source: empty package faces, no fallbacks for
modules that exist, no re-export lists, and no import cycle among our modules (module-level or
hidden in a function)."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ("agents", "audit", "consolelog", "front", "kici_site", "lib", "live", "network", "operations", "scalers")


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every project module by dotted name: (path, is_package). Migrations are left out."""
    found = {}
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found[".".join(parts)] = (path, is_package)
    return found


MODULES = _modules()


def _owner(name: str, modules: dict[str, tuple[Path, bool]]) -> str | None:
    """The project module a dotted import name lands in (``a.b.c`` may be a name in ``a.b``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph(modules: dict[str, tuple[Path, bool]] = MODULES) -> dict[str, set[str]]:
    """Edges module → every project module it imports, at any depth of its body."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        package = name.split(".") if is_package else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                prefix = ".".join(base + ([node.module] if node.module else []))
                targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in modules else prefix for a in node.names]
            else:
                continue
            for target in targets:
                owner = _owner(target, modules)
                if owner and owner != name:
                    graph[name].add(owner)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from .b import f\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from pkg.a import g\n")
    (tmp_path / "pkg" / "c.py").write_text("import pkg.a\n")
    modules = {
        "pkg": (tmp_path / "pkg" / "__init__.py", True),
        **{f"pkg.{m}": (tmp_path / "pkg" / f"{m}.py", False) for m in "abc"},
    }
    assert cycles(import_graph(modules)) == [["pkg.a", "pkg.b"]]


def test_no_import_cycle_among_project_modules():
    assert cycles(import_graph()) == []


def test_every_package_face_is_empty():
    faces = [path for path, is_package in MODULES.values() if is_package and path.read_text().strip()]
    assert [str(p.relative_to(ROOT)) for p in faces] == []


def test_no_module_keeps_a_reexport_list_or_a_fallback_for_a_missing_module():
    found = []
    for name, (path, _) in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                found.append(f"{name}:{node.lineno} __all__")
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                caught = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
                if any(getattr(c, "id", None) in ("ImportError", "ModuleNotFoundError") for c in caught):
                    found.append(f"{name}:{node.lineno} except ImportError")
    assert found == []


def test_project_modules_are_imported_inside_functions_only_where_django_requires_it():
    # AppConfig.ready() is the one place: models and signals can be imported only once the app
    # registry is ready.
    found = []
    for name, (path, _) in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.ImportFrom):
                    target = node.module or ""
                    ours = node.level > 0 or target.split(".")[0] in APPS
                elif isinstance(node, ast.Import):
                    ours = any(alias.name.split(".")[0] in APPS for alias in node.names)
                else:
                    continue
                if ours and not (path.name == "apps.py" and func.name == "ready"):
                    found.append(f"{name}:{node.lineno}")
    assert sorted(set(found)) == []


#: Each app imports only the apps before it (docs/ARCHITECTURE.md).
LAYERS = ("lib", "consolelog", "audit", "agents", "network", "scalers", "operations", "live", "front")


def test_each_app_imports_only_the_apps_below_it():
    rank = {app: i for i, app in enumerate(LAYERS)}
    found = []
    for module, targets in import_graph().items():
        app = module.split(".")[0]
        if app not in rank:
            continue
        for target in targets:
            other = target.split(".")[0]
            if other in rank and rank[other] > rank[app]:
                found.append(f"{module} -> {target}")
            if other == "kici_site":  # the top of the house: settings, URL map, entry points
                found.append(f"{module} -> {target}")
    assert sorted(found) == []


#: The sub-layers inside ``scalers``, lowest first (docs/ARCHITECTURE.md): a module imports only
#: modules of its own sub-layer or of one before it. A module belongs to the sub-layer of its
#: longest matching prefix; every ``scalers`` module must belong to one.
SCALERS_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "records",
        (
            "scalers.api_tokens",
            "scalers.capacity",
            "scalers.choices",
            "scalers.config",
            "scalers.credentials",
            "scalers.hosts",
            "scalers.importing",
            "scalers.kici_agent_log",
            "scalers.kici_orchestrator",
            "scalers.labels",
            "scalers.leader",
            "scalers.metrics",
            "scalers.models",
            "scalers.pauses",
            "scalers.resources",
            "scalers.samples",
            "scalers.warm_schedule",
        ),
    ),
    ("admission", ("scalers.admission", "scalers.waiting", "scalers.warm_pool_config")),
    ("backends", ("scalers.backends",)),
    (
        "lifecycle",
        (
            "scalers.drift",
            "scalers.holds",
            "scalers.jobs",
            "scalers.kici_agents",
            "scalers.lifecycle",
            "scalers.output_caps",
            "scalers.provision_reaper",
            "scalers.recovery",
            "scalers.selftest",
            "scalers.spawn_trace",
            "scalers.warm_pools",
        ),
    ),
    (
        "apis",
        (
            "scalers.admin",
            "scalers.agent_api",
            "scalers.api",
            "scalers.api_models",
            "scalers.apps",
            "scalers.management",
            "scalers.openapi",
            "scalers.scrape",
            "scalers.urls",
        ),
    ),
)


def scalers_layer(module: str, layers=SCALERS_LAYERS) -> int | None:
    """The index of ``module``'s sub-layer in ``layers`` (longest prefix wins), None for none."""
    best: tuple[int, int] | None = None
    for rank, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (rank, len(prefix))
    return best[0] if best else None


def upward_imports_in_scalers(graph: dict[str, set[str]], layers=SCALERS_LAYERS) -> list[str]:
    """``module -> target`` for every import of a later sub-layer, and ``module: in no sub-layer``
    for a ``scalers`` module the table leaves out (so a new module must be placed)."""
    found = []
    for module, targets in graph.items():
        if not module.startswith("scalers."):
            continue
        rank = scalers_layer(module, layers)
        if rank is None:
            found.append(f"{module}: in no sub-layer")
            continue
        for target in targets:
            if target.startswith("scalers.") and (other := scalers_layer(target, layers)) is not None and other > rank:
                found.append(f"{module} -> {target}")
    return sorted(found)


def test_the_sub_layer_check_finds_an_upward_import():
    layers = (("low", ("scalers.low",)), ("high", ("scalers.high",)))
    graph = {"scalers.low": {"scalers.high.x"}, "scalers.high.x": {"scalers.low"}, "scalers.stray": set()}
    assert upward_imports_in_scalers(graph, layers) == [
        "scalers.low -> scalers.high.x",
        "scalers.stray: in no sub-layer",
    ]


def test_each_scalers_module_imports_only_its_sub_layer_and_those_below():
    assert upward_imports_in_scalers(import_graph()) == []


def _tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_no_tracked_file_keeps_a_merge_conflict_marker():
    """A conflict resolved in haste can leave its markers in a docstring or a document, where no
    interpreter trips on them."""
    marker = re.compile(rb"^(<{7} |>{7} |={7}$)", re.M)
    found = []
    for path in _tracked_files():
        if path.is_file() and path.suffix not in {".png", ".ico", ".woff2", ".gz"}:
            if marker.search(path.read_bytes()):
                found.append(str(path.relative_to(ROOT)))
    assert found == []
