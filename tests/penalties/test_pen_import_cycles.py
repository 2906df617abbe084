"""The modules of ``penalties`` import each other without a cycle, counting imports inside
functions too (a function-level import only hides a cycle): ``kernels`` and its checks share
the kernel codes through ``_codes`` (they imported each other before)."""

import ast
from pathlib import Path

import penalties

ROOT = Path(penalties.__file__).parent


def _imports(path: Path) -> set[str]:
    """The ``penalties`` modules ``path`` imports anywhere (module level or in a function)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:  # from .x import y / from . import x
                if node.module:
                    out.add(node.module.split(".")[0])
                else:
                    out.update(a.name for a in node.names)
            elif node.module and node.module.startswith("penalties."):
                out.add(node.module.split(".")[1])
            elif node.module == "penalties":
                out.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names
                       if a.name.startswith("penalties."))
    return out


def test_no_import_cycle_among_the_modules_of_penalties():
    mods = {p.stem: p for p in ROOT.glob("*.py") if p.stem != "__init__"}
    graph = {m: {d for d in _imports(p) if d in mods and d != m} for m, p in mods.items()}
    assert "_kernel_checks" in graph["kernels"] and "kernels" not in graph["_kernel_checks"]
    state = {}

    def visit(m, path):
        state[m] = "open"
        for d in sorted(graph[m]):
            assert state.get(d) != "open", "import cycle: " + " -> ".join(path + [d])
            if d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
