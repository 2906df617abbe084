"""Every fenced Python block and shell command of README.md and docs/*.md runs as pasted.

One process per page (its Python blocks share a namespace, its commands one scratch folder, in
document order), on the embedded digits with small budgets: what the runner changes is listed in
``tests/docs/snippets.py``. A block after ``<!-- snippet: skip -->`` is illustrative and not run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.snippets import REPO, SKIP, extract, page_steps, pages, rewrite, run_page

PAGES = [p for p in pages() if page_steps(p)]


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_page_snippets_run(page, tmp_path):
    proc = run_page(page, tmp_path / "work")
    if proc.returncode:
        pytest.fail(f"a snippet of {page.relative_to(REPO)} failed:\n"
                    f"{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}", pytrace=False)


def test_extract_finds_fences_indented_commands_and_honours_skip():
    text = "\n".join([
        "Text.", "", "```python", "x = 1", "```", "",
        SKIP, "```python", "raise SystemExit('illustrative')", "```", "",
        "```bash", "$ dualdrop sparsify --method logsum \\", "    --out runs/a   # a comment",
        "# only a comment", "dualdrop compare --methods none --out 'runs/#b'", "```", "",
        "    Omega(w) = 1/2 min_eta w^2/eta", "", "Then:", "",
        "    dualdrop penalties --out results/p", "", "And:", "",
        "    from dualdrop.linear import alpha_max", "", "    alpha_max", "", "Text.",
        SKIP, "", "    dualdrop sparsify --method vardrop --data-dir MNIST", "",
        "- a list item", "", "```sh", "python3 -c 'print(1)'", "```",
    ])
    steps = extract(Path("page.md"), text)
    assert [(s.kind, s.code.strip()) for s in steps] == [
        ("python", "x = 1"),
        ("shell", "dualdrop sparsify --method logsum --out runs/a"),
        ("shell", "dualdrop compare --methods none --out 'runs/#b'"),
        ("shell", "dualdrop penalties --out results/p"),
        ("python", "from dualdrop.linear import alpha_max\n\nalpha_max"),
        ("shell", "python3 -c 'print(1)'"),
    ]
    assert steps[0].source == "page.md:3"


def test_rewrite_sets_small_budgets_and_the_embedded_data():
    assert rewrite("dualdrop sparsify --method logsum --data-dir data/mnist --out r") == \
        "dualdrop sparsify --method logsum --data-dir .mnist --no-verify --out r --epochs 2"
    assert rewrite("dualdrop diagnose runs/a --data-dir data/mnist --out d") == \
        "dualdrop diagnose runs/a --out d"
    assert rewrite("dualdrop compare --methods a b --epochs 200 --out r") == \
        "dualdrop compare --methods a b --epochs 2 --out r"
    assert rewrite("dualdrop sparsify --epochs 1 --stop-after 5 --out r") == \
        "dualdrop sparsify --epochs 1 --stop-after 1 --out r"
    assert rewrite("dualdrop frontier --methods a --n-trials 6 --workers 3 --out f") == \
        "dualdrop frontier --methods a --n-trials 2 --workers 1 --out f --epochs 2"
    assert rewrite("dualdrop frontier --out f --report-only") == "dualdrop frontier --out f --report-only"
    assert rewrite("nohup dualdrop sparsify --epochs 3 --out r > log 2>&1 &") == \
        "nohup dualdrop sparsify --epochs 2 --out r > log 2>&1"
    assert rewrite('pip install -e ".[docs]"') is None
    assert rewrite("python3 -c \"from dualdrop.data import download_mnist; download_mnist('d')\"") is None


def test_readme_and_docs_have_no_placeholders():
    """The names a newcomer cannot paste: undefined models, data and paths from elsewhere."""
    bad = re.compile(r"\bMyNet\b|--density D\b|\bresidual_mlp\(in,|\.\./shared|/work/|"
                     r"results/seeds_mnist/runs")
    found = []
    for page in pages():
        for k, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if bad.search(line):
                found.append(f"{page.relative_to(REPO)}:{k}: {line.strip()}")
    assert not found, "placeholders left:\n" + "\n".join(found)


def test_readme_relative_links_resolve():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (REPO / target.split("#")[0]).exists():
            missing.append(target)
    assert not missing, f"README links to files that do not exist: {missing}"
