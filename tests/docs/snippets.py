"""Extract the runnable snippets of a Markdown page and run them in order, as a reader would.

What counts as a snippet:

- a fenced block whose info string is ``python`` / ``py``: Python code. The Python blocks of one
  page share one namespace (a reader pastes them into one session, top to bottom);
- a fenced block whose info string is ``bash`` / ``sh`` / ``shell`` / ``console``: shell
  commands, one per logical line (a trailing ``\\`` continues it; ``$`` prompts are dropped);
- an indented (4-space) code block that starts like a command (``dualdrop``, ``python3``,
  ``torchrun``, ...) or like Python (``import`` / ``from``): the same, so that nothing runnable
  escapes the check by its formatting. Other indented blocks (formulas, output) are prose.

A block right after the line ``<!-- snippet: skip -->`` is deliberately illustrative and is not
run. Every step of a page runs in one scratch folder, in document order, so a command that
writes ``runs/x`` feeds a later ``load_run("runs/x")``.

What the runner changes, and nothing else (the budgets and data of a test run):

- ``dualdrop``, ``python`` and ``python3`` are this interpreter with the repository on
  ``PYTHONPATH`` (the tree under test, not an installed copy);
- no MNIST download in a test: a command that downloads MNIST is not run, and ``--data-dir
  PATH`` of ``sparsify`` / ``frontier`` reads a small MNIST-shaped stand-in instead (the digits
  scaled to 28x28 in the four IDX files, with ``--no-verify``: its checksums are not MNIST's);
  the other commands drop ``--data-dir`` and use the embedded digits;
- ``--epochs N`` of ``sparsify`` / ``compare`` / ``frontier`` is at most 2 (``--epochs 2`` added
  if absent), ``--stop-after`` at most 1, ``--n-trials N`` at most 2, ``--workers N`` 1;
- ``pip install ...`` is not run: the environment under test is installed already (CI runs the
  README's two install commands itself, in ``.ci/run``);
- a trailing ``&`` (a background run) is dropped so the command finishes before the next one.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path

SKIP = "<!-- snippet: skip -->"
PY_FENCES = {"python", "py", "python3"}
SH_FENCES = {"bash", "sh", "shell", "console"}
COMMANDS = ("dualdrop", "python", "python3", "torchrun", "pip", "nohup", "nice", "mkdocs",
            "OMP_NUM_THREADS=", "PYTHONPATH=", "MPLBACKEND=", "benchmarks/", "./")
REPO = Path(__file__).resolve().parents[2]
EPOCHS = 2  # the most epochs a training command runs in the test
MNIST_STAND_IN = ".mnist"  # in the page's scratch folder (write_mnist_stand_in)


@dataclass
class Step:
    kind: str      # "python" or "shell"
    code: str
    source: str    # "README.md:120"


def _is_command(line: str) -> bool:
    s = line.strip()
    return any(s == c or s.startswith(c + " ") or (c.endswith(("=", "/")) and s.startswith(c))
               for c in COMMANDS)


def _shell_commands(lines: list[str]) -> list[str]:
    """Logical commands of a shell block: continuation lines joined, comments and prompts off."""
    out, cur = [], ""
    for raw in lines:
        line = raw.rstrip()
        if not cur:
            line = line.lstrip()
            if line.startswith("$ "):
                line = line[2:]
            if not line or line.startswith("#"):
                continue
        if cur:
            line = line.lstrip()
        if line.endswith("\\"):
            cur += line[:-1].rstrip() + " "
            continue
        cur += line
        out.append(_strip_comment(cur).strip())
        cur = ""
    if cur.strip():
        out.append(_strip_comment(cur).strip())
    return [c for c in out if c]


def _strip_comment(cmd: str) -> str:
    """Drop a trailing ``# comment`` that is outside quotes."""
    quote = None
    for i, ch in enumerate(cmd):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or cmd[i - 1].isspace()):
            return cmd[:i]
    return cmd


def _looks_like_python(line: str) -> bool:
    s = line.strip()
    return s.startswith("import ") or (s.startswith("from ") and " import " in s)


def extract(path: Path, text: str | None = None) -> list[Step]:
    """The snippets of one Markdown page, in document order (see the module docstring)."""
    text = path.read_text(encoding="utf-8") if text is None else text
    lines = text.splitlines()
    try:
        name = str(path.resolve().relative_to(REPO))
    except ValueError:
        name = path.name
    steps: list[Step] = []
    i, prev, blank_before = 0, "", True
    while i < len(lines):
        line = lines[i]
        skip = prev.strip() == SKIP
        m = re.match(r"^( {0,3})(`{3,}|~{3,})\s*([\w+-]*)", line)
        if m:
            indent, fence, info = m.group(1), m.group(2), m.group(3).lower()
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(fence):
                j += 1
            body = [ln[len(indent):] if ln.startswith(indent) else ln for ln in lines[i + 1:j]]
            if not skip:
                src = f"{name}:{i + 1}"
                if info in PY_FENCES:
                    steps.append(Step("python", "\n".join(body) + "\n", src))
                elif info in SH_FENCES:
                    steps += [Step("shell", c, src) for c in _shell_commands(body)]
            prev, blank_before, i = "", False, j + 1
            continue
        if line.startswith("    ") and line.strip() and blank_before:
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            block = [ln[4:] for ln in lines[i:j]]
            while block and not block[-1].strip():
                block.pop()
            if not skip:
                src = f"{name}:{i + 1}"
                if _looks_like_python(block[0]):
                    steps.append(Step("python", "\n".join(block) + "\n", src))
                elif _is_command(block[0]):
                    steps += [Step("shell", c, src) for c in _shell_commands(block)]
            prev, blank_before, i = "", True, j
            continue
        blank_before = not line.strip()
        if line.strip():
            prev = line
        i += 1
    return steps


def rewrite(cmd: str) -> str | None:
    """The command as the test runs it (module docstring), or None when it is not run."""
    if re.search(r"(^|\s)pip3?\s+install\b", cmd) or "download_mnist" in cmd:
        return None
    cmd = re.sub(r"\s*&\s*$", "", cmd)
    words = cmd.split()
    if any(w in ("sparsify", "frontier") for w in words[:8]) and "--data-dir" in cmd:
        cmd = re.sub(r"\s--data-dir(=|\s+)\S+", f" --data-dir {MNIST_STAND_IN} --no-verify", cmd)
    cmd = re.sub(r"\s--data-dir(=|\s+)(?!" + MNIST_STAND_IN + r")\S+", "", cmd)
    if any(w in ("sparsify", "compare", "frontier") for w in words[:8]) and \
            "--report-only" not in words and "--from-runs" not in words and \
            "--list-hparams" not in words and "--help" not in words:
        if re.search(r"--epochs(=|\s+)\d+", cmd):
            cmd = re.sub(r"--epochs(=|\s+)(\d+)",
                         lambda m: f"--epochs {min(int(m.group(2)), EPOCHS)}", cmd)
        else:
            cmd += f" --epochs {EPOCHS}"
        cmd = re.sub(r"--stop-after(=|\s+)(\d+)",
                     lambda m: f"--stop-after {min(int(m.group(2)), EPOCHS - 1)}", cmd)
    cmd = re.sub(r"--n-trials(=|\s+)(\d+)", lambda m: f"--n-trials {min(int(m.group(2)), 2)}", cmd)
    cmd = re.sub(r"--workers(=|\s+)\d+", "--workers 1", cmd)
    return cmd


def page_steps(path: Path) -> list[dict]:
    steps = []
    for s in extract(path):
        if s.kind == "shell":
            code = rewrite(s.code)
            if code is None:
                continue
            s = Step("shell", code, s.source)
        steps.append(asdict(s))
    return steps


# The driver runs in a fresh process per page: one namespace for the page's Python blocks, one
# scratch folder for everything; it stops at the first failing step and names it.
DRIVER = textwrap.dedent(r'''
    import json, os, subprocess, sys, time, traceback
    steps = json.load(open(sys.argv[1]))
    ns = {"__name__": "__main__"}
    for k, s in enumerate(steps):
        t0 = time.perf_counter()
        print(f"--- step {k + 1}/{len(steps)} ({s['source']}, {s['kind']}): "
              + s["code"].strip().splitlines()[0][:100], flush=True)
        if s["kind"] == "python":
            try:
                exec(compile(s["code"], s["source"], "exec"), ns)
            except BaseException:
                traceback.print_exc()
                print(f"SNIPPET FAILED: {s['source']}", flush=True)
                sys.exit(1)
        else:
            r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", s["code"]])
            if r.returncode:
                print(f"SNIPPET FAILED: {s['source']} (exit {r.returncode}): {s['code']}",
                      flush=True)
                sys.exit(1)
        print(f"    {time.perf_counter() - t0:.1f} s", flush=True)
        try:
            import matplotlib.pyplot as plt
            plt.close("all")
        except ImportError:
            pass
''')


def write_mnist_stand_in(folder: Path, n_train: int = 1000) -> Path:
    """The four MNIST IDX files holding scikit-learn's digits, each 8x8 image scaled to 24x24
    and padded to 28x28: MNIST's format and shapes, a few seconds per epoch."""
    import numpy as np
    from sklearn.datasets import load_digits

    from dualdrop.data import write_idx

    X, y = load_digits(return_X_y=True)
    img = np.kron(X.reshape(-1, 8, 8), np.ones((3, 3)))
    img = np.pad(img * 15.0, ((0, 0), (2, 2), (2, 2))).astype(np.uint8)
    folder.mkdir(parents=True, exist_ok=True)
    write_idx(folder / "train-images-idx3-ubyte", img[:n_train])
    write_idx(folder / "train-labels-idx1-ubyte", y[:n_train].astype(np.uint8))
    write_idx(folder / "t10k-images-idx3-ubyte", img[n_train:])
    write_idx(folder / "t10k-labels-idx1-ubyte", y[n_train:].astype(np.uint8))
    return folder


def run_page(path: Path, workdir: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run every snippet of ``path`` in ``workdir`` (module docstring); returns the process."""
    workdir.mkdir(parents=True, exist_ok=True)
    write_mnist_stand_in(workdir / MNIST_STAND_IN)
    bindir = workdir / ".bin"
    bindir.mkdir(exist_ok=True)
    for name, args in (("python", ""), ("python3", ""), ("dualdrop", " -m dualdrop")):
        exe = bindir / name
        exe.write_text(f'#!/bin/sh\nexec "{sys.executable}"{args} "$@"\n')
        exe.chmod(0o755)
    (workdir / ".steps.json").write_text(json.dumps(page_steps(path)))
    (workdir / ".driver.py").write_text(DRIVER)
    env = dict(os.environ)
    env.update({
        "PATH": f"{bindir}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]]
                                                     if env.get("PYTHONPATH") else [])),
        "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1",
        "PYTHONUNBUFFERED": "1",
    })
    return subprocess.run([sys.executable, str(workdir / ".driver.py"),
                           str(workdir / ".steps.json")], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=timeout)


def pages() -> list[Path]:
    """README.md and every top-level page under docs/."""
    return [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))


if __name__ == "__main__":  # python tests/docs/snippets.py docs/linear.md [workdir]
    import tempfile
    page = Path(sys.argv[1]).resolve()
    work = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(tempfile.mkdtemp(prefix="snip"))
    for s in page_steps(page):
        print(f"[{s['source']}] {s['kind']}: {s['code'].strip().splitlines()[0][:110]}")
    proc = run_page(page, work)
    print(proc.stdout[-20000:], proc.stderr[-8000:])
    sys.exit(proc.returncode)
