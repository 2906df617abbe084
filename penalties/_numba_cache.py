"""Where numba keeps the compiled kernels of this project: a per-user cache, never the package.

numba's default for ``cache=True`` writes ``*.nbi`` / ``*.nbc`` files into the ``__pycache__``
folder beside the source. For an installed package that folder is inside ``site-packages``, and
those files outlive an uninstall: pip removes the files it installed, the cache files stay, and the
leftover ``site-packages/penalties/`` folder (no ``__init__.py`` any more) is then imported as an
empty namespace package that shadows a later editable install (``cannot import name 'get' from
'penalties' (unknown location)``).

So the kernels of ``penalties`` and ``dualdrop`` are cached in a per-user cache directory:

1. ``NUMBA_CACHE_DIR`` when set (numba's own setting, honoured for every function);
2. else ``$DUALDROP_CACHE_DIR/numba``, ``$XDG_CACHE_HOME/dualdrop/numba`` or
   ``~/.cache/dualdrop/numba`` (``%LOCALAPPDATA%\\dualdrop\\numba`` on Windows);
3. if that is not writable, numba's own fallbacks (its per-user cache, then none).

Only functions defined in this project's two packages are redirected: other numba code in the
same process keeps numba's defaults. Entries are keyed by the absolute path of the source folder
(numba's own scheme), so two installs never share or overwrite each other's entries.

Stale entries. numba invalidates a cached function when *its own* source file changes, but a
kernel compiled from ``dualdrop/linear/_jit.py`` also inlines the scalar kernels of
``penalties/kernels.py``: after an upgrade (or an edit) of the latter, numba would load the old
machine code and silently compute with the old formulas. The stamp of every entry of this project
therefore also carries a fingerprint (path, modification time and size) of every source file of
both packages that uses numba, so that any change to any of them recompiles everything that may
depend on it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_ROOTS = tuple(str(Path(__file__).resolve().parent.parent / name) + os.sep
               for name in ("penalties", "dualdrop"))


def source_fingerprint() -> str:
    """A digest of every numba-using source file of both packages (path, mtime, size)."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        import hashlib

        h = hashlib.sha256()
        for root in _ROOTS:
            for f in sorted(Path(root).rglob("*.py")):
                try:
                    if "numba" not in f.read_text(encoding="utf-8", errors="ignore"):
                        continue
                    st = f.stat()
                except OSError:
                    continue
                h.update(f"{f}:{st.st_mtime_ns}:{st.st_size};".encode())
        _FINGERPRINT = h.hexdigest()[:16]
    return _FINGERPRINT


_FINGERPRINT: str | None = None


def is_compiled(*dispatchers) -> bool:
    """Whether every numba dispatcher has machine code at hand: compiled in this process, or a
    valid entry in the cache for this source (its first call then loads it in well under a
    second instead of compiling for up to a minute). Reads numba's cache index (not a public
    API): True when it cannot be read."""
    for d in dispatchers:
        if d.signatures:
            continue
        try:
            if not d._cache._cache_file._load_index():
                return False
        except Exception:  # numba's internals moved: say nothing rather than be wrong
            continue
    return True


_ANNOUNCED: set[int] = set()  # ids of the dispatchers a notice was given for (once a process)


def first_use_notice(dispatchers, what: str) -> str | None:
    """A line telling the user that ``what`` compiles its kernels now (first use after an
    install or upgrade), or ``None`` when they are compiled or cached, or a notice was already
    given for them in this process (the caller prints it: :func:`announce_first_use`)."""
    todo = [d for d in dispatchers if id(d) not in _ANNOUNCED]
    if not todo or is_compiled(*todo):
        return None
    _ANNOUNCED.update(id(d) for d in dispatchers)
    return (f"{what}: compiling numba kernels for their first use (several seconds, once; "
            f"cached in {cache_dir()})")


def announce_first_use(dispatchers, what: str) -> None:
    """Print :func:`first_use_notice` on stderr when there is one: the code that is about to
    call the dispatchers says so itself, whoever its caller is (a first compile is a silent
    pause of seconds otherwise, which looks like a hang)."""
    notice = first_use_notice(dispatchers, what)
    if notice:
        print(notice, file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """The folder this project's numba cache goes to (``NUMBA_CACHE_DIR`` takes precedence)."""
    env = os.environ.get("NUMBA_CACHE_DIR")
    if env:
        return Path(env)
    own = os.environ.get("DUALDROP_CACHE_DIR")
    if own:
        return Path(own) / "numba"
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "dualdrop" / "numba"


def install() -> None:
    """Register the locator with numba (idempotent; a no-op on numba versions without the hook)."""
    try:
        from numba.core import caching
    except ImportError:  # pragma: no cover - numba is a hard dependency
        return
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    base = (getattr(caching, "UserWideCacheLocator", None)
            or getattr(caching, "_UserWideCacheLocator", None))
    if impl is None or base is None or not hasattr(impl, "_locator_classes"):  # pragma: no cover
        return
    if any(getattr(c, "_dualdrop", False) for c in impl._locator_classes):
        return

    class ProjectCacheLocator(base):
        """numba's per-user locator, pointed at :func:`cache_dir`, for this project's files only."""

        _dualdrop = True

        def __init__(self, py_func, py_file):
            super().__init__(py_func, py_file)
            self._cache_path = str(cache_dir() / self.get_suitable_cache_subpath(py_file))

        def get_source_stamp(self):
            # the file's own stamp plus every kernel file's: see "Stale entries" above
            return (super().get_source_stamp(), source_fingerprint())

        @classmethod
        def from_function(cls, py_func, py_file):
            if not os.path.abspath(py_file).startswith(_ROOTS):
                return None
            return super().from_function(py_func, py_file)

    # first: before numba's user-provided locator (NUMBA_CACHE_DIR, which cache_dir() honours
    # with numba's own layout) and its in-tree one (which would write into site-packages)
    impl._locator_classes = [ProjectCacheLocator] + list(impl._locator_classes)
