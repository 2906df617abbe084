"""A Griffe extension of the documentation site (mkdocs.yml: mkdocstrings ``extensions``).

- mkdocstrings reads docstrings from the source without importing it. A class whose decorator
  completes its docstring at import time (``dualdrop.linear.glm``'s ``_with_init_doc`` appends
  the constructor note the GLM estimators share) would show only the part written in the class
  body. For a decorated class this extension imports the object and takes its runtime docstring
  when that one extends the static one; nothing else is imported.
- Docstrings hold reStructuredText "simple tables" (columns under ``=====  =====`` rules), which
  Markdown prints as one paragraph of words and rules; they become Markdown tables. A row whose
  first cell is empty, or follows a first cell that ends with a comma, continues the row above.
"""

from __future__ import annotations

import importlib
import inspect
import re

import griffe

# decorators that never touch a docstring: no import for them
_PLAIN = {"dataclass", "dataclasses.dataclass", "property", "staticmethod", "classmethod",
          "functools.total_ordering", "total_ordering"}


def _runtime_doc(path: str) -> str | None:
    module, _, name = path.rpartition(".")
    while module:
        try:
            obj = importlib.import_module(module)
            break
        except ImportError:
            module, _, outer = module.rpartition(".")
            name = f"{outer}.{name}"
    else:
        return None
    for part in name.split("."):
        obj = getattr(obj, part, None)
    return inspect.getdoc(obj) if obj is not None else None


_RULE = re.compile(r"^( *)(=+)((?: +=+)+) *$")


def _columns(rule: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in re.finditer(r"=+", rule)]


def _cells(line: str, cols: list[tuple[int, int]]) -> list[str]:
    # a cell is cut where its column's rule starts; a word that runs past that point (a long
    # name in a narrow first column) stays whole in its cell
    cuts = []
    for start, _ in cols[1:]:
        while 0 < start < len(line) and line[start - 1] != " " and line[start] != " ":
            start += 1
        cuts.append(start)
    bounds = [cols[0][0], *cuts, len(line)]
    return [line[a:b].strip() for a, b in zip(bounds, bounds[1:])]


def _escape(cell: str) -> str:
    # a pipe ends a Markdown cell, except inside a code span (where a backslash would show)
    parts = re.split(r"(``.*?``|`[^`]*`)", cell)
    return "".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def _row(cells: list[str], indent: str) -> str:
    return indent + "| " + " | ".join(_escape(c) for c in cells) + " |"


def rst_tables_to_markdown(text: str) -> str:
    """``text`` with every reStructuredText simple table written as a Markdown table."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = _RULE.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        rule, cols = lines[i], _columns(lines[i])
        rows: list[list[str]] = []
        header = None
        j = i + 1
        while j < len(lines) and lines[j].strip() and not (
                _RULE.match(lines[j]) and _columns(lines[j]) == cols and lines[j + 1:j + 2]
                and not lines[j + 1].strip()) and not (
                _RULE.match(lines[j]) and j + 1 == len(lines)):
            if _RULE.match(lines[j]) and _columns(lines[j]) == cols:  # the header's rule
                header, rows = rows, []
            else:
                cells = _cells(lines[j], cols)
                if rows and (not cells[0] or rows[-1][0].endswith(",")):
                    rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
                else:
                    rows.append(cells)
            j += 1
        if j >= len(lines) or not _RULE.match(lines[j]) or not rows:
            out.append(rule)  # not a table after all
            i += 1
            continue
        indent = m.group(1)
        head = header[0] if header else [""] * len(cols)
        if out and out[-1].strip():
            out.append("")
        out.append(_row(head, indent))
        out.append(indent + "|" + " --- |" * len(cols))
        out.extend(_row(r, indent) for r in ([*header[1:], *rows] if header else rows))
        if j + 1 < len(lines) and lines[j + 1].strip():
            out.append("")
        i = j + 1
    return "\n".join(out)


class RuntimeDocstrings(griffe.Extension):
    """Decorated classes get the docstring their decorators built."""

    def on_class_instance(self, *, cls: griffe.Class, **kwargs) -> None:
        names = {str(d.value).split("(")[0] for d in cls.decorators}
        if not names - _PLAIN:
            return
        doc = _runtime_doc(cls.path)
        static = cls.docstring.value if cls.docstring else ""
        if doc and doc != static and doc.startswith(static):
            if cls.docstring:
                cls.docstring.value = doc
            else:
                cls.docstring = griffe.Docstring(doc, parent=cls)


class RstTables(griffe.Extension):
    """reStructuredText simple tables in docstrings become Markdown tables."""

    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring and "==" in obj.docstring.value:
            obj.docstring.value = rst_tables_to_markdown(obj.docstring.value)
