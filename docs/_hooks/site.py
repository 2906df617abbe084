"""mkdocs hooks of the documentation site (mkdocs.yml: ``hooks``).

- The benchmark results live beside the scripts that produce them (``benchmarks/RESULTS.md`` and
  ``benchmarks/history/<topic>.md``, with the figures they show); the site publishes them as
  ``benchmarks.md`` and ``benchmarks/history/*.md`` without copying them into ``docs/``. Their
  relative links are rewritten to the site's layout; the history pages are reachable from the
  results page and left out of the navigation.
- Docstrings are written in reStructuredText-flavoured prose (````code````, ``:func:`name```);
  the roles are dropped from the rendered API pages so that only the code span remains.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|obj|exc|py:\w+):(?=<code>)")
_IMG = re.compile(r"\]\(\.\./((?:\w+/)*figures/[^)\s]+)\)")


def _results_page() -> str:
    text = (BENCH / "RESULTS.md").read_text(encoding="utf-8")
    # the history files sit at benchmarks/history/ in the site as in the repository
    return text.replace("](history/", "](benchmarks/history/")


def _history_page(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    text = text.replace("](../RESULTS.md", "](../../benchmarks.md")
    return text


def on_files(files, config):
    files.append(File.generated(config, "benchmarks.md", content=_results_page()))
    figures = set()
    for path in sorted((BENCH / "history").glob("*.md")):
        content = _history_page(path)
        figures.update(_IMG.findall(content))
        f = File.generated(config, f"benchmarks/history/{path.name}", content=content)
        f.inclusion = InclusionLevel.NOT_IN_NAV
        files.append(f)
    for rel in sorted(figures):
        src = BENCH / rel
        if src.is_file():  # a missing figure is reported by mkdocs as a broken link
            files.append(File.generated(config, f"benchmarks/{rel}", content=src.read_bytes()))
    return files


def on_page_content(html, page, config, files):
    return _ROLE.sub("", html)
