"""What can break the documentation site and is cheap to check without building it.

CI builds the site with ``mkdocs build --strict`` (links, anchors, every directive resolves) and
screenshots it; these tests cover what the build does not refuse: formulas that would need a
network, an API page that lists internals or forgets an export, a page that names a doc page
or a published file as code instead of linking to it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

# API page -> the modules whose public names it documents
API_PAGES = {
    "penalties": ["penalties", "penalties.curves"],
    "linear": ["dualdrop.linear"],
    "nn": ["dualdrop.nn"],
    "train": ["dualdrop.train", "dualdrop.train.callbacks"],
    "data": ["dualdrop.data"],
    "diagnostics": ["dualdrop.diagnostics"],
    "dynamics": ["dualdrop.dynamics"],
}
# exported for other tools, not for readers: scikit-learn's check_estimator plumbing
HIDDEN = {"dualdrop.linear": {"expected_failed_checks"}}
_DIRECTIVE = re.compile(r"^::: *([\w.]+)\s*$", re.M)


class _Loader(yaml.SafeLoader):
    pass


# mkdocs.yml may hold !!python/name tags (Material's emoji options); none are needed here
_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
_Loader.add_multi_constructor("!", lambda loader, suffix, node: None)


def _config() -> dict:
    return yaml.load((REPO / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_Loader)


def _extensions(config) -> dict:
    out = {}
    for ext in config["markdown_extensions"]:
        name, opts = next(iter(ext.items())) if isinstance(ext, dict) else (ext, {})
        out[name] = opts or {}
    return out


def _public_names(modname: str) -> list[str]:
    mod = importlib.import_module(modname)
    names = getattr(mod, "__all__", None)
    if names is None:  # a module without __all__: what it defines itself
        names = [n for n, v in vars(mod).items() if not n.startswith("_")
                 and getattr(v, "__module__", None) == modname]
    return [n for n in names if n not in HIDDEN.get(modname, set())]


def _resolve(path: str):
    """The object a ``::: path`` directive renders: like Griffe, a submodule before an attribute
    of its package of the same name (``dualdrop.nn.compact`` is the module, not the function)."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


# ---------------------------------------------------------------- formulas, offline


def test_math_is_typeset_by_the_vendored_katex_with_no_network():
    config = _config()
    ext = _extensions(config)
    assert "pymdownx.arithmatex" in ext and ext["pymdownx.arithmatex"].get("generic") is True
    assets = config.get("extra_javascript", []) + config.get("extra_css", [])
    for asset in assets:
        path = asset if isinstance(asset, str) else asset["path"]
        assert "//" not in path, f"{path}: the site must render offline (ship it under docs/)"
        assert (DOCS / path).is_file(), f"mkdocs.yml names {path}, not in docs/"
    for needed in ("vendor/katex/katex.min.js", "vendor/katex/katex.min.css",
                   "javascripts/katex.js"):
        assert needed in assets
    # the renderer is loaded after KaTeX itself
    js = config["extra_javascript"]
    assert js.index("vendor/katex/katex.min.js") < js.index("javascripts/katex.js")


def test_every_font_the_katex_stylesheet_names_is_shipped():
    css = (DOCS / "vendor/katex/katex.min.css").read_text(encoding="utf-8")
    urls = set(re.findall(r"url\(([^)]+)\)", css))
    assert urls, "no font in katex.min.css"
    missing = sorted(u for u in urls if not (DOCS / "vendor/katex" / u).is_file())
    assert not missing, f"katex.min.css names fonts that are not shipped: {missing[:5]}"


def test_renderer_handles_the_arithmatex_markup():
    js = (DOCS / "javascripts/katex.js").read_text(encoding="utf-8")
    assert ".arithmatex" in js and "katex.render" in js and "displayMode" in js


# ---------------------------------------------------------------- code blocks fit


def test_long_code_lines_wrap_instead_of_running_off_the_page():
    config = _config()
    assert "stylesheets/site.css" in config["extra_css"]
    css = (DOCS / "stylesheets/site.css").read_text(encoding="utf-8")
    rule = re.search(r"\.md-typeset pre > code\s*\{([^}]*)\}", css)
    assert rule and "pre-wrap" in rule.group(1)
    assert _extensions(config)["pymdownx.highlight"].get("line_spans") == "__span"


# ---------------------------------------------------------------- the API reference


def test_api_directives_hide_private_members_and_sklearn_plumbing():
    plugin = next(p for p in _config()["plugins"] if isinstance(p, dict) and "mkdocstrings" in p)
    options = plugin["mkdocstrings"]["handlers"]["python"]["options"]
    filters = [re.compile(f[1:]) for f in options["filters"] if f.startswith("!")]

    def hidden(name):
        return any(f.search(name) for f in filters)

    for name in ("_fit", "__sklearn_tags__", "set_fit_request", "set_score_request",
                 "get_metadata_routing", "expected_failed_checks"):
        assert hidden(name), f"{name} would be listed on the API pages"
    for name in ("fit", "predict", "regularization_path", "set_strength"):
        assert not hidden(name), f"{name} would be hidden from the API pages"
    assert not options.get("inherited_members"), "inherited members drag in torch/sklearn APIs"
    assert options.get("show_submodules") is False


@pytest.mark.parametrize("page", sorted(API_PAGES))
def test_api_page_documents_every_export_and_nothing_private(page):
    text = (DOCS / "api" / f"{page}.md").read_text(encoding="utf-8")
    directives = _DIRECTIVE.findall(text)
    # options that would bring back private members or sklearn plumbing
    for bad in ("filters:", "inherited_members:", "members: true"):
        assert bad not in text, f"docs/api/{page}.md overrides the site's filters ({bad})"
    documented = set()
    for path in directives:
        obj = _resolve(path)
        if inspect.ismodule(obj):  # a section's introduction: the module docstring alone
            block = re.search(rf"^::: {re.escape(path)}\n((?: {{4}}.*\n)*)", text, re.M)
            assert block and "members: false" in block.group(1), (
                f"docs/api/{page}.md: '::: {path}' renders the module {path} with all its "
                f"members (a function of the same name is '::: {path}.{path.rsplit('.', 1)[1]}')")
            continue
        assert not any(p.startswith("_") for p in path.split(".")), (
            f"docs/api/{page}.md documents {path} through a private path")
        documented.add(id(obj))
    for modname in API_PAGES[page]:
        for name in _public_names(modname):
            obj = getattr(importlib.import_module(modname), name)
            if id(obj) in documented:
                continue
            # constants and modules are named in the page's text instead
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                assert (f"`{name}`" in text or f"`{modname}.{name}`" in text
                        or f"{modname}.{name}" in directives), (
                    f"docs/api/{page}.md does not mention {modname}.{name}")
                continue
            pytest.fail(f"{modname}.{name} is exported but not on docs/api/{page}.md: add "
                        f"'::: {modname}.{name}' under its section")
    for name in HIDDEN.get(API_PAGES[page][0], ()):
        assert name not in text


def test_api_page_opens_with_one_intro_and_the_public_api_before_internals():
    text = (DOCS / "api" / "linear.md").read_text(encoding="utf-8")
    directives = [d for d in _DIRECTIVE.findall(text) if not inspect.ismodule(_resolve(d))]
    assert directives[0] == "dualdrop.linear.SparseLinearRegression"
    assert directives.index("dualdrop.linear.Problem") > directives.index(
        "dualdrop.linear.SparseGLMCV")
    # the package docstring is not rendered beside the page's own introduction
    assert "::: dualdrop.linear\n" not in text and "::: dualdrop.linear\r" not in text


@pytest.mark.parametrize("page", sorted(API_PAGES))
def test_documented_objects_have_a_docstring_at_run_time(page):
    """mkdocstrings skips an object without a docstring, and so does ``help()``."""
    text = (DOCS / "api" / f"{page}.md").read_text(encoding="utf-8")
    for path in _DIRECTIVE.findall(text):
        obj = _resolve(path)
        assert inspect.getdoc(obj), f"{path} has no docstring (help() shows nothing)"


def test_glm_estimators_document_the_shared_constructor_parameters():
    from dualdrop.linear import (SparseGammaRegression, SparseGLM, SparseHuberRegression,
                                 SparsePoissonRegression, SparseQuantileRegression)

    for cls in (SparseGLM, SparsePoissonRegression, SparseGammaRegression,
                SparseHuberRegression, SparseQuantileRegression):
        doc = inspect.getdoc(cls)
        assert doc and "Parameters as" in doc and doc.index("Parameters as") > 0, cls.__name__


# ---------------------------------------------------------------- links that are links

# a code span that is a documentation page or a file the site publishes: it must be a link
_PUBLISHED = {"benchmarks/RESULTS.md", "CHANGELOG.md"}


def _code_spans(text: str):
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # fenced blocks
    text = re.sub(r"^(?: {4}|\t).*$", "", text, flags=re.M)     # indented blocks
    return re.finditer(r"(?<!`)`([^`\n]+)`(?!`)", text)


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_doc_pages_link_to_pages_instead_of_naming_them_in_code(page):
    text = (DOCS / page).read_text(encoding="utf-8")
    pages = {p.name for p in DOCS.glob("*.md")}
    bad = []
    for m in _code_spans(text):
        span = m.group(1).strip()
        target = re.sub(r"^docs/", "", span).split("#")[0]
        if (span.startswith("docs/") and target in pages) or span in _PUBLISHED:
            bad.append(span)
    assert not bad, (f"docs/{page} names {bad} as code: write a link, e.g. "
                     f"[The duality](theory.md) or [Benchmarks](../benchmarks/RESULTS.md)")


def _prose(text: str) -> str:
    """``text`` without code blocks, code spans and Markdown links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = re.sub(r"^(?: {4}|\t).*$", "", text, flags=re.M)
    text = re.sub(r"`[^`\n]+`", "", text)
    return re.sub(r"\[[^\]]*\]\([^)]*\)", "", text)


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_doc_pages_do_not_name_pages_as_plain_paths(page):
    prose = _prose((DOCS / page).read_text(encoding="utf-8"))
    # a quoted "docs/theory.md section N" shows how docstrings refer to the page
    bad = re.findall(r'(?<!["/\w])(docs/[\w-]+\.md|(?:benchmarks/)?RESULTS\.md)', prose)
    assert not bad, f"docs/{page} names {bad} as a plain path: write a link"


def test_link_checker_sees_a_code_span_page_name():
    spans = [m.group(1) for m in _code_spans("See `docs/theory.md` and `x = 1`.\n\n```\n"
                                             "`docs/theory.md`\n```\n")]
    assert spans == ["docs/theory.md", "x = 1"]


def test_rst_tables_in_docstrings_become_markdown_tables():
    spec = importlib.util.spec_from_file_location(
        "griffe_runtime_docs", DOCS / "_hooks" / "griffe_runtime_docs.py")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    text = "\n".join([
        "Intro.", "", "====  =====", "name  value", "====  =====",
        "``a|b``  one",          # a name wider than its column, a pipe in code
        "      two",             # an empty first cell continues the row
        "``c``,",                # a first cell ending with a comma continues too
        "``d``  three | four",
        "====  =====", "", "After. ====",
    ])
    assert ext.rst_tables_to_markdown(text).split("\n") == [
        "Intro.", "", "| name | value |", "| --- | --- |", "| ``a|b`` | one two |",
        "| ``c``, ``d`` | three \\| four |", "", "After. ====",
    ]
    plain = "A rule alone\n\n=====\n\nand  ====  ==== in prose"
    assert ext.rst_tables_to_markdown(plain) == plain


# ---------------------------------------------------------------- every formula parses

_KATEX_CHECK = r"""
const katex = require(process.argv[2]);
const items = JSON.parse(require("fs").readFileSync(0, "utf8"));
const bad = [];
for (const [where, tex, display] of items) {
  try {
    katex.renderToString(tex, {displayMode: display, throwOnError: true, strict: "error"});
  } catch (e) {
    bad.push(where + ": " + e.message.split("\n")[0]);
  }
}
console.log(JSON.stringify(bad));
"""


def _formulas(page: Path) -> list[tuple[str, str, bool]]:
    """(page, TeX, display) of every formula of a page, found by the site's own Markdown setup."""
    import html

    import markdown

    config = _config()
    exts, conf = [], {}
    for name, opts in _extensions(config).items():
        if name == "pymdownx.snippets":
            continue
        exts.append(name)
        conf[name] = opts
    out = markdown.markdown(page.read_text(encoding="utf-8"), extensions=exts,
                            extension_configs=conf)
    found = []
    for tag, body in re.findall(r'<(span|div) class="arithmatex">(.*?)</\1>', out, re.S):
        tex = html.unescape(body).strip()[2:-2]
        found.append((page.name, tex, tag == "div"))
    return found


def test_every_formula_of_the_docs_parses_in_katex(tmp_path):
    """A typo in a formula renders as red source text on the site; KaTeX (in node) says where."""
    import json
    import shutil
    import subprocess

    pytest.importorskip("pymdownx", reason="the [docs] extra is not installed")
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    items = [f for page in sorted(DOCS.glob("*.md")) for f in _formulas(page)]
    assert len(items) > 300, f"only {len(items)} formulas found: is arithmatex configured?"
    script = tmp_path / "check.js"
    script.write_text(_KATEX_CHECK, encoding="utf-8")
    proc = subprocess.run([node, str(script), str(DOCS / "vendor/katex/katex.min.js")],
                          input=json.dumps(items), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    bad = json.loads(proc.stdout)
    assert not bad, "formulas KaTeX cannot typeset:\n" + "\n".join(bad[:20])


def _hook_module(name: str):
    spec = importlib.util.spec_from_file_location(name, DOCS / "_hooks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_code_blocks_without_line_spans_get_one_span_per_line():
    pytest.importorskip("mkdocs", reason="the [docs] extra is not installed")
    site = _hook_module("site")
    body = '<span class="s">"""one\ntwo"""</span> x\ny\n'
    out = site._line_spans(body)
    lines = [ln + "</span>" for ln in out.split("\n</span>")[:-1]]
    assert len(lines) == 3 and all(ln.startswith('<span class="dd-line">') for ln in lines)
    assert out.endswith("\n</span>") and "</span>\n<span" not in out  # no blank line between
    for ln in lines:  # every line's tags balance
        assert ln.count("<span") == ln.count("</span>")
    assert re.sub(r"<[^>]+>", "", out) == re.sub(r"<[^>]+>", "", body)
    # blocks that already have pymdownx's line spans are left alone
    spanned = '<span id="__span-0-1">a\n</span><span id="__span-0-2">b\n</span>'
    assert site._line_spans(spanned) == spanned


def test_docstring_references_to_doc_pages_become_links():
    pytest.importorskip("mkdocs", reason="the [docs] extra is not installed")
    site = _hook_module("site")
    html = ("<p>(docs/theory.md section 3) and (<code>benchmarks/RESULTS.md</code>, "
            "&quot;Inference&quot;) and docs/nope.md</p><pre><code>docs/theory.md</code></pre>")
    out = site._link_doc_refs(html, "api/penalties.html", DOCS)
    assert '<a href="../theory.html#3-the-catalog">docs/theory.md</a> section 3' in out
    assert '<code><a href="../benchmarks.html#inference">benchmarks/RESULTS.md</a></code>' in out
    assert "docs/nope.md</p>" in out  # not a page: left as written
    untouched = '<span title="docs/theory.md section 1">x</span>'  # an attribute
    assert site._link_doc_refs(untouched, "api/x.html", DOCS) == untouched
    inside = site._link_doc_refs("<code>docs/theory.md section 1, more</code>", "api/x.html", DOCS)
    assert inside.startswith("<code><a href=") and inside.endswith(", more</code>")
    assert "<pre><code>docs/theory.md</code></pre>" in out  # never inside code blocks


def _cells(row: str) -> int:
    """Cells of a Markdown table row as Python-Markdown splits it: on every pipe that is not
    escaped or inside a code span (a pipe inside $...$ math splits the row too)."""
    row = re.sub(r"(`+).*?\1", "", row.strip())
    row = row.replace("\\|", "")
    return len(row.strip("|").split("|"))


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_table_rows_have_as_many_cells_as_their_header(page):
    """A bare |w| in a table cell ends the cell: the rest of the row silently disappears."""
    text = re.sub(r"^```.*?^```", "", (DOCS / page).read_text(encoding="utf-8"),
                  flags=re.S | re.M)
    bad, header = [], None
    for no, line in enumerate(text.splitlines(), 1):
        if not line.lstrip().startswith("|"):
            header = None
            continue
        if header is None:
            header = _cells(line)
        elif _cells(line) != header and not re.fullmatch(r"[\s|:-]+", line):
            bad.append(f"line {no}: {_cells(line)} cells, header {header}")
    assert not bad, f"docs/{page}: rows split by a pipe ($\\lvert w\\rvert, \\|): {bad[:5]}"


# ------------------------------------------------- links that work in the sources and the site

def _github_slug(heading: str) -> str:
    """The anchor a forge (GitHub) gives a Markdown heading: lowercased, markup and punctuation
    but hyphens and underscores dropped, spaces made hyphens (the site's slugify agrees on the
    headings the docs link to)."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {_github_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text,
                                                          flags=re.M)}


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_relative_links_resolve_in_the_source_tree(page):
    """A link read on a forge or in an editor opens its file and section: every relative link
    of a page names a file that exists beside it (``../benchmarks/RESULTS.md`` for the results,
    which the site publishes as ``benchmarks.md``) and an anchor among that file's headings."""
    text = (DOCS / page).read_text(encoding="utf-8")
    if text.lstrip().startswith("--8<--"):
        return  # a page made of an included file
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = re.sub(r"`[^`\n]+`", "", text)
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:|^#|^/", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (DOCS / page).parent / path
        if path.endswith("/") or not path or not dest.resolve().exists():
            bad.append(target)
        elif anchor and path.endswith(".md") and anchor not in _anchors(dest):
            bad.append(target)
    assert not bad, f"docs/{page}: links that do not resolve from the source file: {bad}"


def test_results_links_become_site_links():
    hook = _hook_module("site")

    class Page:
        class file:
            src_uri = "inference.md"

    md = "[B](../benchmarks/RESULTS.md#inference) and [R](../benchmarks/RESULTS.md) [x](x.md)"
    out = hook.on_page_markdown(md, Page, {}, None)
    assert out == "[B](benchmarks.md#inference) and [R](benchmarks.md) [x](x.md)"
