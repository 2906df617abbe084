"""Compiled kernels are cached per user, never inside the installed packages.

numba's default writes ``*.nbi``/``*.nbc`` beside the sources; in ``site-packages`` those files
outlive ``pip uninstall`` and turn the leftover folder into an empty namespace package that shadows
a later install. Each case runs in a fresh interpreter so that the locator is set up from scratch.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import penalties

PKG_DIRS = [Path(penalties.__file__).resolve().parent]

SCRIPT = textwrap.dedent("""
    import numpy as np, penalties
    from penalties import kernels
    P = penalties.get("logsum", eps=2.0)
    code, params = P.kernel_spec()
    print(kernels.omega_scalar(code, params, 1.0))
""")


def _run(env_extra, tmp_path, script=SCRIPT):
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "DUALDROP_CACHE_DIR")}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _cache_files(root):
    return [p for p in Path(root).rglob("*") if p.suffix in (".nbi", ".nbc")]


def test_cache_goes_to_the_user_cache_dir(tmp_path):
    before = {p for d in PKG_DIRS for p in _cache_files(d)}
    _run({"XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path / "home")}, tmp_path)
    assert _cache_files(tmp_path / "xdg" / "dualdrop" / "numba"), "no cache entries written"
    after = {p for d in PKG_DIRS for p in _cache_files(d)}
    assert after <= before, f"cache files written into the package: {sorted(after - before)[:3]}"


def test_dualdrop_cache_dir_and_numba_cache_dir_are_honoured(tmp_path):
    _run({"DUALDROP_CACHE_DIR": str(tmp_path / "own")}, tmp_path)
    assert _cache_files(tmp_path / "own" / "numba")
    _run({"NUMBA_CACHE_DIR": str(tmp_path / "nb"), "DUALDROP_CACHE_DIR": str(tmp_path / "own2")}, tmp_path)
    assert _cache_files(tmp_path / "nb")
    assert not (tmp_path / "own2").exists()


def test_other_numba_code_keeps_numba_defaults(tmp_path):
    mod = tmp_path / "usermod.py"
    mod.write_text("from numba import njit\n@njit(cache=True)\ndef f(x):\n    return x + 1\n")
    script = "import penalties, usermod; print(usermod.f(1))"
    _run({"DUALDROP_CACHE_DIR": str(tmp_path / "own")}, tmp_path, script=script)
    assert _cache_files(tmp_path / "__pycache__"), "a user's own function should cache beside its source"
    assert not any("usermod" in p.name for p in _cache_files(tmp_path / "own"))


def test_a_change_to_any_kernel_file_invalidates_every_entry(tmp_path, monkeypatch):
    """numba's own stamp is the defining file's; kernels inline other files' kernels, so the
    project's stamp also fingerprints every numba-using source file."""
    from penalties import _numba_cache as nc

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("import numba\n")
    (pkg / "b.py").write_text("x = 1\n")  # no numba: not part of the fingerprint
    monkeypatch.setattr(nc, "_ROOTS", (str(pkg) + os.sep,))
    monkeypatch.setattr(nc, "_FINGERPRINT", None)
    first = nc.source_fingerprint()
    monkeypatch.setattr(nc, "_FINGERPRINT", None)
    (pkg / "b.py").write_text("x = 22\n")
    assert nc.source_fingerprint() == first
    monkeypatch.setattr(nc, "_FINGERPRINT", None)
    (pkg / "a.py").write_text("import numba  # edited\n")
    assert nc.source_fingerprint() != first


def test_entries_carry_the_fingerprint():
    from numba.core import caching

    from penalties import _numba_cache as nc
    from penalties import kernels

    nc.install()
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    loc_cls = next(c for c in impl._locator_classes if getattr(c, "_dualdrop", False))
    assert impl._locator_classes[0] is loc_cls  # before NUMBA_CACHE_DIR's and the in-tree one
    fn = kernels._omega_scalar.py_func
    loc = loc_cls.from_function(fn, fn.__code__.co_filename)
    assert loc is not None
    assert loc.get_source_stamp()[1] == nc.source_fingerprint()
