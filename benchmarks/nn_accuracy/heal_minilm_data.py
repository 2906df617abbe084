"""Healing and validation text for ``heal_minilm.py`` beyond the standard library's calibration
pool: the docstrings of the installed third-party packages (``site-packages``).

The evaluation sentences of the MiniLM benchmarks come from the standard library
(``structured_minilm_data.py``); this text comes from other files (and any sentence that also
occurs in the standard library is dropped), so it can be healed on without touching the
evaluation text. Packages are split by name: ``crc32(top-level name) % 8 == 0`` goes to the
validation pool (to choose a recipe on, never healed on), the rest to the healing pool. The
sentences are cut as ``structured_minilm_data`` cuts the standard library's (6 to 60 words),
cached as JSON in the work folder (reading every package takes about a CPU-minute).
"""

from __future__ import annotations

import ast
import json
import os
import random
import re
import sysconfig
import zlib
from pathlib import Path

from structured_minilm_data import SKIP_DIRS, stdlib_sentences

SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def _docstring_sentences(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError, RecursionError):
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if not doc:
                continue
            for s in SENTENCE.split(re.sub(r"\s+", " ", doc)):
                s = s.strip()
                if 6 <= len(s.split()) <= 60 and not s.startswith(">>>"):
                    yield s


def package_sentences(work: Path | None = None) -> tuple[list[str], list[str]]:
    """``(healing pool, validation pool)``: site-packages docstring sentences (module
    docstring), in a fixed shuffled order, none of them in the standard library's text."""
    cache = Path(work) / "package_sentences.json" if work is not None else None
    if cache is not None and cache.is_file():
        d = json.loads(cache.read_text())
        return d["heal"], d["val"]
    calib, evals = stdlib_sentences()
    seen = set(calib) | set(evals)
    pools = {"heal": [], "val": []}
    root = sysconfig.get_paths()["purelib"]
    for top in sorted(os.listdir(root)):
        base = os.path.join(root, top)
        if not os.path.isdir(base) or top.endswith((".dist-info", ".egg-info")) or \
                top.startswith(("_", ".")) or top in ("dualdrop",):
            continue
        pool = pools["val"] if zlib.crc32(top.encode()) % 8 == 0 else pools["heal"]
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for fn in sorted(filenames):
                if fn.endswith(".py") and not fn.startswith("test_"):
                    for s in _docstring_sentences(os.path.join(dirpath, fn)):
                        if s not in seen:
                            seen.add(s)
                            pool.append(s)
    for name, pool in pools.items():
        random.Random(name).shuffle(pool)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp")
        tmp.write_text(json.dumps(pools))
        os.replace(tmp, cache)
    return pools["heal"], pools["val"]
