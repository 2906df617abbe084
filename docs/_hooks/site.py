"""mkdocs hooks of the documentation site (mkdocs.yml: ``hooks``).

- The benchmark results live beside the scripts that produce them (``benchmarks/RESULTS.md`` and
  ``benchmarks/history/<topic>.md``, with the figures they show); the site publishes them as
  ``benchmarks.md`` and ``benchmarks/history/*.md`` without copying them into ``docs/``. Their
  relative links are rewritten to the site's layout; the history pages are reachable from the
  results page and left out of the navigation. The pages link to the results as the source tree
  has them (``[Benchmarks](../benchmarks/RESULTS.md#inference)``: a link that works on a forge
  and in an editor); those links become links to ``benchmarks.md`` in the site.
- Docstrings are written in reStructuredText-flavoured prose (````code````, ``:func:`name```,
  ``Example::``); the roles are dropped from the rendered pages so that only the code span
  remains, a literal-block marker ``::`` reads as one colon, and the doubled backticks of
  ````code```` inside a parameter's type are dropped.
- Code blocks of docstrings come without the one-span-per-line markup that
  ``pymdownx.highlight`` gives the pages' own blocks (``line_spans``); each of their lines is
  wrapped in a ``<span class="dd-line">`` (tags open at a line end closed and reopened), so that
  stylesheets/site.css continues a long wrapped line with a hanging indent there too.
- Docstrings point the reader to the documentation as ``docs/theory.md section 3`` or
  ``benchmarks/RESULTS.md, "Inference"`` (words that read right in ``help()``); on the API pages
  these become links to the page, and to the section when it is named.
"""

from __future__ import annotations

import posixpath
import re
from functools import cache
from pathlib import Path

from markdown.extensions.toc import slugify
from mkdocs.structure.files import File, InclusionLevel

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|obj|exc|py:\w+):<code>~?")
_LITERAL = re.compile(r"::</p>")
_IMG = re.compile(r"\]\(\.\./((?:\w+/)*figures/[^)\s]+)\)")
_CODE = re.compile(r"<code>([^<]*)</code>")
# "docs/theory.md section 2" / "(benchmarks/RESULTS.md, "Inference")", in a code span or not
_DOC_REF = re.compile(r"(<code>)?(docs/([\w-]+)\.md|benchmarks/RESULTS\.md)(</code>)?"
                      r"(?:(,? section (\d+))|(, (?:section )?(?:&quot;|\")([^&\"<]+)(?:&quot;|\")))?")
_PRE = re.compile(r"(<pre\b.*?</pre>)", re.S)
_BLOCK = re.compile(r"(<pre\b[^>]*>(?:<span></span>)?<code\b[^>]*>)(.*?)(</code></pre>)", re.S)
_TAG = re.compile(r"<(/?)span\b[^>]*>")


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


def _line_spans(body: str) -> str:
    """Each line of a highlighted code block in its own span, nesting kept valid."""
    if 'id="__span' in body or "\n" not in body.rstrip("\n"):
        return body
    out, stack = [], []
    for line in body.rstrip("\n").split("\n"):
        reopened = "".join(stack)
        for m in _TAG.finditer(line):
            if m.group(1):
                if stack:
                    stack.pop()
            else:
                stack.append(m.group(0))
        # the newline inside the line's span, as pymdownx writes it: between two block
        # spans it would be an empty line of its own
        out.append(f'<span class="dd-line">{reopened}{line}{"</span>" * len(stack)}\n</span>')
    return "".join(out)


@cache
def _headings(source: Path) -> tuple[tuple[str, str], ...]:
    """(heading text, anchor) of every heading of a Markdown file, as the toc extension slugs."""
    out = []
    for line in source.read_text(encoding="utf-8").splitlines():
        m = re.match(r"#{2,4} +(.+?) *$", line)
        if m:
            out.append((m.group(1), slugify(m.group(1), "-")))
    return tuple(out)


def _doc_link(m: re.Match, page_url: str, docs_dir: Path) -> str:
    code_open, path, name, code_close = m.group(1), m.group(2), m.group(3), m.group(4)
    before = m.string[:m.start()]
    if before.rfind("<") > before.rfind(">"):
        return m.group(0)  # inside a tag's attribute
    if name is not None:
        source, target = docs_dir / f"{name}.md", f"{name}.html"
    else:
        source, target = BENCH / "RESULTS.md", "benchmarks.html"
    if not source.is_file():
        return m.group(0)
    anchor = ""
    if m.group(6):  # section N: the heading numbered "N."
        anchor = next((a for t, a in _headings(source) if t.startswith(f"{m.group(6)}.")), "")
    elif m.group(8):  # a section named in quotes
        anchor = next((a for t, a in _headings(source) if t == m.group(8)), "")
    href = posixpath.relpath(target, posixpath.dirname(page_url) or ".")
    if anchor:
        href += f"#{anchor}"
    # the link inside the code span, if any: nesting stays valid when the span goes on
    return (f'{code_open or ""}<a href="{href}">{path}</a>{code_close or ""}'
            f'{m.group(5) or m.group(7) or ""}')


def _link_doc_refs(html: str, page_url: str, docs_dir: Path) -> str:
    parts = _PRE.split(html)  # never inside a code block
    for i in range(0, len(parts), 2):
        parts[i] = _DOC_REF.sub(lambda m: _doc_link(m, page_url, docs_dir), parts[i])
    return "".join(parts)


# a page's link to the results as the source tree has them (docs/x.md -> ../benchmarks/RESULTS.md,
# which works on a forge and in an editor); the site publishes that file as benchmarks.md
_RESULTS_LINK = re.compile(r"\]\(((?:\.\./)+)benchmarks/RESULTS\.md(?=[#)])")


def on_page_markdown(markdown, page, config, files):
    depth = page.file.src_uri.count("/")
    up = "../" * (depth + 1)  # from the page's folder in docs/ to the repository root

    def site(m):
        return ("](" + "../" * depth + "benchmarks.md") if m.group(1) == up else m.group(0)

    return _RESULTS_LINK.sub(site, markdown)


def on_page_content(html, page, config, files):
    html = _ROLE.sub("<code>", html)  # ":class:`~pkg.Name`": the code span alone
    # a reStructuredText literal-block marker ("Example::" before an indented block) reads as
    # one colon once the block is rendered as code
    html = _LITERAL.sub(":</p>", html)
    html = _BLOCK.sub(lambda m: m.group(1) + _line_spans(m.group(2)) + m.group(3), html)
    if page.file.src_uri.startswith("api/"):
        # "bool (``True`` only)" in a parameter's type
        html = _CODE.sub(lambda m: f"<code>{m.group(1).replace('``', '')}</code>", html)
        html = _link_doc_refs(html, page.url, Path(config["docs_dir"]))
    return html
