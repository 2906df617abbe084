"""The scripts of examples/ run and write their figures, and the site shows each of them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.docs.snippets import REPO

EXAMPLES = sorted((REPO / "examples").glob("*.py"))
# small budgets for the test; the scripts' defaults are what the site's figures show
ARGS = {"sparsify_network.py": ["--epochs", "2"], "noise_diagnostics.py": ["--steps", "120"]}


@pytest.mark.slow
@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_writes_its_figure(script, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, str(script), "--out", str(tmp_path),
                        *ARGS.get(script.name, [])], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    pngs = list(tmp_path.glob("*.png"))
    assert len(pngs) == 1 and pngs[0].stat().st_size > 20_000, pngs


def test_every_example_is_on_the_site_with_its_figure():
    page = (REPO / "docs" / "examples.md").read_text(encoding="utf-8")
    assert EXAMPLES
    for script in EXAMPLES:
        assert f'--8<-- "examples/{script.name}"' in page, script.name
        text = script.read_text(encoding="utf-8")
        figure = text.split('path = out / "')[1].split('"')[0] if 'path = out / "' in text else \
            text.split('fig_path = out / "')[1].split('"')[0]
        assert f"images/examples/{figure}" in page, figure
        assert (REPO / "docs" / "images" / "examples" / figure).is_file(), figure
