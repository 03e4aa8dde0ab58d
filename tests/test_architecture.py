"""Layers import only downward, and no module imports itself back: every import in ``oasr/``
and ``backend/``, read with `ast`.

`TIERS` is the one place the allowed directions are written; docs/architecture.md ("Layers and
allowed imports") draws the same table, and `test_the_docs_draw_these_tiers` keeps the two equal.
Every import statement counts wherever it stands: at module level, inside a function (a lazy
import is still a dependency) and under ``if TYPE_CHECKING:`` (a layer that needs a higher
layer's type to describe itself leaks just the same, even if nothing is imported at run time).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("oasr", "backend")

# Bottom first. A module may import its own layer and any layer of a lower tier; importing a
# layer of its own tier (sideways) or of a higher one (upward) is a violation. A layer is a
# package (its modules and subpackages); "oasr" is only the package's own __init__ (the
# specification's `from oasr import GpuDecoderConfig`).
TIERS: tuple[tuple[str, ...], ...] = (
    ("oasr.cpu",),  # what the machine's CPU has: read by the kernel rules of every layer
    ("oasr.text", "oasr.audio", "oasr.fmha"),
    ("oasr.lm", "oasr.cache"),
    ("oasr.decoding", "oasr.models"),
    # the engine, bottom up: its events and the model families; the Whisper runtime (jobs,
    # not streams); the live-text policy; the engine's config; the runner (one batched
    # paged encoder call); the loop core on top (oasr.engine's own modules)
    ("oasr.engine.events", "oasr.engine.families"),
    ("oasr.engine.second_pass",),
    ("oasr.engine.live",),
    ("oasr.engine.config",),
    ("oasr.engine.runner",),
    ("oasr.engine",),
    ("oasr.benchmarks",),
    ("oasr.cli", "oasr"),
    ("backend",),
)
TIER_OF = {layer: tier for tier, layers in enumerate(TIERS) for layer in layers}

# (file, imported layer): known violations being removed on another branch. None left: the
# cache layer takes its decoder through the StreamingDecoder protocol (issue 21).
PENDING_EXCEPTIONS: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Violation:
    path: str  # relative to the scanned root, "/"-separated
    line: int
    source: str  # the importing module's layer ("" when the file belongs to none)
    target: str  # the imported module, as written (resolved if relative)
    target_layer: str | None

    def __str__(self) -> str:
        if self.target_layer is None:
            return f"{self.path}:{self.line}: {self.target} belongs to no layer (add it to TIERS)"
        direction = "sideways" if TIER_OF[self.target_layer] == TIER_OF[self.source] else "upward"
        return (f"{self.path}:{self.line}: {self.source} imports {self.target} "
                f"({self.target_layer}, {direction})")


def layer_of(module: str) -> str | None:
    """The layer a dotted module name belongs to: the longest layer that is it or contains it
    ("oasr" only for the package itself); None for a first-party module outside every layer."""
    if module == "oasr":
        return "oasr"
    matches = [layer for layer in TIER_OF
               if layer != "oasr" and (module == layer or module.startswith(layer + "."))]
    return max(matches, key=len, default=None)


def _module_name(path: Path, root: Path) -> tuple[str, bool]:
    """(dotted name, is a package __init__) of a file under ``root``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def _from_import_target(base: str, name: str) -> str:
    """The module ``from base import name`` depends on: ``base.name`` when that is a module of
    another layer (``from oasr import cache``), else ``base``."""
    submodule = f"{base}.{name}"
    return submodule if layer_of(submodule) not in (None, layer_of(base)) else base


def _from_base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a ``from X import ...`` in ``module`` names as X (relative ones resolved)."""
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        anchor = package[:len(package) - node.level + 1]
        base = ".".join([*anchor, *([base] if base else [])])
    return base


def _imported_modules(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, first-party module) for every import anywhere in ``tree`` (functions and
    TYPE_CHECKING blocks included); relative imports resolved against ``module``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, module, is_package)
            # `from oasr import cache` imports the subpackage: its own layer decides
            names = [_from_import_target(base, alias.name) for alias in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in PACKAGES:
                yield node.lineno, name


def find_violations(root: Path) -> list[Violation]:
    """Every import in ``root``/oasr and ``root``/backend that goes sideways or upward, and
    every module that belongs to no layer."""
    found: list[Violation] = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            module, is_package = _module_name(path, root)
            source = layer_of(module)
            if source is None:
                found.append(Violation(rel, 1, "", module, None))
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
            for line, target in _imported_modules(tree, module, is_package):
                target_layer = layer_of(target)
                if target_layer == source:
                    continue
                if target_layer is None or TIER_OF[target_layer] >= TIER_OF[source]:
                    found.append(Violation(rel, line, source, target, target_layer))
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the first-party modules it imports (anywhere in the file), for every module
    under ``root``/oasr and ``root``/backend; a package's own name stands for its __init__."""
    modules: dict[str, tuple[Path, bool]] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            modules[_module_name(path, root)[0]] = (path, path.name == "__init__.py")

    def known(name: str) -> str | None:  # `from pkg.mod import Name`: the module pkg.mod
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in modules.items():
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(known(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _from_base(node, module, is_package)
                # `from pkg import mod` imports the module pkg.mod
                targets.update(known(f"{base}.{alias.name}") for alias in node.names)
        graph[module] = {t for t in targets if t is not None and t != module
                         and t.split(".")[0] in PACKAGES}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (each an import circle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_import_circle() -> None:
    cycles = import_cycles(import_graph(REPO_ROOT))
    assert not cycles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_circle_finder_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    files = {
        "oasr/__init__.py": "",
        "oasr/engine/__init__.py": "",
        "oasr/engine/a.py": "from oasr.engine.b import B\n",
        "oasr/engine/b.py": "def f():\n    from oasr.engine import c\n",  # lazy
        "oasr/engine/c.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                             "    from oasr.engine.a import A\n"),  # types only
        "oasr/engine/d.py": "from oasr.engine.a import A\n",  # below the circle, not in it
        "backend/__init__.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert import_cycles(import_graph(tmp_path)) == [
        ["oasr.engine.a", "oasr.engine.b", "oasr.engine.c"]]


def test_layers_import_only_downward() -> None:
    violations = [v for v in find_violations(REPO_ROOT)
                  if (v.path, v.target_layer) not in PENDING_EXCEPTIONS]
    assert not violations, "\n".join(map(str, violations))


def test_pending_exceptions_still_happen() -> None:
    seen = {(v.path, v.target_layer) for v in find_violations(REPO_ROOT)}
    stale = PENDING_EXCEPTIONS - seen
    assert not stale, f"fixed: delete {stale} from PENDING_EXCEPTIONS"


def test_the_checker_finds_upward_sideways_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    files = {
        "oasr/__init__.py": "from oasr.decoding import GpuDecoderConfig\n",
        "oasr/cache/__init__.py": "",
        "oasr/cache/pool.py": "",
        "oasr/cache/bad.py": (
            "from __future__ import annotations\n"
            "from typing import TYPE_CHECKING\n"
            "import numpy\n"                                       # third party: ignored
            "from oasr.fmha import paged_attention\n"             # tier 0: allowed
            "from . import pool\n"                                 # own layer: allowed
            "from .. import text\n"                                # oasr.text: allowed
            "from oasr.engine.config import EngineConfig\n"       # 7: upward
            "from oasr.lm import CharNgramLm\n"                    # 8: sideways
            "if TYPE_CHECKING:\n"
            "    from oasr.decoding import GpuStreamingDecoder\n"  # 10: upward, types only
            "def serve():\n"
            "    import backend.app\n"                             # 12: upward, lazy
            "    from oasr import GpuDecoderConfig\n"              # 13: the facade, upward
            "    from oasr import audio\n"                          # 14: oasr.audio: allowed
        ),
        "oasr/stray.py": "",
        "backend/__init__.py": "from oasr.cli import main\n",     # downward: allowed
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = [str(v) for v in find_violations(tmp_path)]
    assert found == [
        "oasr/cache/bad.py:7: oasr.cache imports oasr.engine.config (oasr.engine.config, upward)",
        "oasr/cache/bad.py:8: oasr.cache imports oasr.lm (oasr.lm, sideways)",
        "oasr/cache/bad.py:10: oasr.cache imports oasr.decoding (oasr.decoding, upward)",
        "oasr/cache/bad.py:12: oasr.cache imports backend.app (backend, upward)",
        "oasr/cache/bad.py:13: oasr.cache imports oasr (oasr, upward)",
        "oasr/stray.py:1: oasr.stray belongs to no layer (add it to TIERS)",
    ]


def test_the_docs_draw_these_tiers() -> None:
    doc = (REPO_ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = doc.split("## Layers and allowed imports")[1].split("\n## ")[0]
    drawn: dict[int, set[str]] = {}
    for tier, layers in re.findall(r"^\| (\d+) \| ([^|]+) \|", section, flags=re.MULTILINE):
        drawn[int(tier)] = set(re.findall(r"`([a-z_.]+)`", layers))
    assert drawn == {tier: set(layers) for tier, layers in enumerate(TIERS)}
