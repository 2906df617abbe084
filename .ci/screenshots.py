"""Screenshots of the built documentation site in headless Chromium, checked not to be blank.

    python3 .ci/screenshots.py SITE_DIR OUT_DIR

Opens the index and one API reference page of a site built by ``mkdocs build`` (file URLs, no
server, no network), writes ``OUT_DIR/index.png`` and ``OUT_DIR/api-nn.png``, and fails (exit 1)
when a screenshot is missing or blank: too small a file, too few distinct gray levels, or text
covering too little or too much of the page.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

PAGES = {"index": "index.html", "api-nn": "api/nn.html"}
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
        why = check(png)
        if why:
            bad.append(f"{png}: {why}")
        else:
            print(f"screenshots: {png} ({png.stat().st_size // 1024} KB)")
    for line in bad:
        print(f"screenshots: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
