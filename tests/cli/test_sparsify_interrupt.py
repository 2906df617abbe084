"""Ctrl-C (SIGINT) sent to the installed ``dualdrop sparsify`` command: at any moment, one line on
stderr saying what is saved and how to continue, exit status 130, no traceback. Three moments:
while the command still imports torch (before any option is read), after the run folder is
written but before the first epoch's checkpoint, and after a checkpoint."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc and sends SIGINT")


def _start(out: Path):
    command = shutil.which("dualdrop")
    if command is None:
        pytest.skip("the dualdrop console script is not installed")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [command, "sparsify", "--method", "logsum", "--epochs", "30", "--threads", "1",
         "--no-progress", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_for(proc, ready, timeout=120.0):
    end = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def _interrupt(proc):
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    lines = err.strip().splitlines()
    assert proc.returncode == 130, err
    assert len(lines) == 1 and lines[0].startswith("dualdrop sparsify: interrupted"), err
    return lines[0]


def test_while_importing(tmp_path):
    out = tmp_path / "run"
    proc = _start(out)
    maps = Path(f"/proc/{proc.pid}/maps")

    def importing_torch():  # torch is first imported when the subcommands are registered
        try:
            return "libtorch" in maps.read_text()
        except OSError:
            return False

    _wait_for(proc, importing_torch)
    line = _interrupt(proc)
    assert "nothing was saved; run the same command again" in line
    assert not out.exists()


def test_before_the_first_checkpoint(tmp_path):
    out = tmp_path / "run"
    proc = _start(out)
    _wait_for(proc, (out / "config.json").exists)
    line = _interrupt(proc)
    if not (out / "checkpoint.pt").exists():
        assert "no epoch had finished" in line
    assert line.endswith(f"--out {out} --resume"), line


def test_after_a_checkpoint(tmp_path):
    out = tmp_path / "run"
    proc = _start(out)
    _wait_for(proc, (out / "checkpoint.pt").exists)
    line = _interrupt(proc)
    assert f"is checkpointed in {out}; continue with: dualdrop sparsify" in line
    assert line.endswith(f"--out {out} --resume"), line


def test_ctrl_c_inside_a_finalizer_is_delivered_after_it():
    """A Ctrl-C that lands in a weakref callback (numba's ``on_disposal``, run by the garbage
    collector while a command compiles) was printed as "Exception ignored" and swallowed: the
    command went on and exited 0. It is re-sent once the callback has returned."""
    import weakref

    from dualdrop.cli import _interrupts_outside_llvm

    class Held:
        pass

    def on_disposal(ref):
        os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        with _interrupts_outside_llvm():
            held = Held()
            ref = weakref.ref(held, on_disposal)
            del held  # the callback runs here, and the interrupt lands inside it
            end = time.monotonic() + 5.0
            while time.monotonic() < end:  # the re-sent interrupt arrives here
                time.sleep(0.001)
    assert ref() is None and time.monotonic() < end
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
