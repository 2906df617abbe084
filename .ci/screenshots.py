"""Screenshots of the built documentation site in headless Chromium, checked not to be blank.

    python3 .ci/screenshots.py SITE_DIR OUT_DIR

Opens pages of a site built by ``mkdocs build`` (file URLs, no server, no network): the index,
two API reference pages, a theory page full of formulas and a user-guide page with long code
lines; writes ``OUT_DIR/<name>.png`` for each, and fails (exit 1) when a screenshot is missing or
blank (too small a file, too few distinct gray levels, or text covering too little or too much
of the page) or when a page's formulas are not typeset: the page as the browser built it
(``--dump-dom``, after its scripts ran) must have every ``arithmatex`` element rendered by the
vendored KaTeX and no KaTeX error.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

PAGES = {"index": "index.html", "api-nn": "api/nn.html", "api-linear": "api/linear.html",
         "theory": "theory.html", "glm": "glm.html"}
MIN_FORMULAS = {"theory": 100}  # a page that must hold typeset formulas
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
         "--window-size=1280,1600"]


def check(png: Path) -> str | None:
    """Why ``png`` is not a readable page, or None."""
    if not png.is_file():
        return "missing"
    if png.stat().st_size < 20_000:
        return f"{png.stat().st_size} bytes: blank or nearly"
    from PIL import Image

    img = Image.open(png).convert("L")
    hist = img.histogram()
    total = sum(hist)
    levels = sum(1 for h in hist if h > total * 1e-5)
    ink = sum(hist[:200]) / total  # pixels darker than the page's white and light grays
    if levels < 20:
        return f"only {levels} gray levels: blank or one flat color"
    if not 0.01 < ink < 0.6:
        return f"{ink:.1%} of the page is ink: no text, or a solid block"
    return None


def check_math(dom: str, name: str) -> str | None:
    """Why the formulas of a rendered page (``--dump-dom``) are not typeset, or None."""
    total = len(re.findall(r'class="arithmatex"', dom))
    done = len(re.findall(r'class="arithmatex" data-katex-done="1"', dom))
    if "katex-error" in dom:
        bad = re.findall(r'class="katex-error"[^>]*title="([^"]*)"', dom)
        return f"KaTeX could not typeset a formula: {bad[0] if bad else '?'}"
    if done < total:
        return f"{total - done} of {total} formulas left as source (KaTeX did not run)"
    if total < MIN_FORMULAS.get(name, 0):
        return f"only {total} formulas (expected at least {MIN_FORMULAS[name]})"
    return None


def main(site: Path, out: Path) -> int:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("screenshots: chromium is not installed (Debian: apt-get install chromium)",
              file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    bad = []
    for name, page in PAGES.items():
        target = (site / page).resolve()
        if not target.is_file():
            bad.append(f"{page}: not in the site {site}")
            continue
        png = out / f"{name}.png"
        png.unlink(missing_ok=True)
        subprocess.run([browser, *FLAGS, f"--screenshot={png}", target.as_uri()],
                       capture_output=True, timeout=120)
        dom = subprocess.run([browser, *FLAGS, "--virtual-time-budget=5000", "--dump-dom",
                              target.as_uri()], capture_output=True, text=True, timeout=120)
        why = check(png) or check_math(dom.stdout, name)
        if why:
            bad.append(f"{png}: {why}")
        else:
            n = dom.stdout.count('data-katex-done="1"')
            print(f"screenshots: {png} ({png.stat().st_size // 1024} KB, {n} formulas typeset)")
    for line in bad:
        print(f"screenshots: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
