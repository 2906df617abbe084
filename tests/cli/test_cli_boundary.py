"""The command line's one error boundary: every subcommand turns a user's error into one line
naming the option (exit 2) and Ctrl-C into one line saying how to continue (exit 130)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dualdrop.cli import UsageError, main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    (d / "afile").write_text("I am a file\n")
    (d / "corrupt.npz").write_bytes(b"PK\x03\x04 truncated zip")
    (d / "header_only.csv").write_text("a,b,target\n1,2,3\n")
    (d / "ok.csv").write_text("1,2,3\n4,5,6.5\n7,8,10\n2,1,0\n")
    (d / "header.csv").write_text("a,b,target\n1,2,3\n4,5,6.5\n7,8,10\n2,1,0\n")
    (d / "badrow.csv").write_text("1,2,3\n4,x,6\n")
    (d / "frontier").mkdir()
    (d / "frontier" / "study.journal").write_bytes(b"\x00\x01 not a journal")
    return d


def run(argv, capsys):
    """``(exit status, stderr lines)`` of ``dualdrop ARGV`` run in this process."""
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err


BAD = [  # (argv with {d} for the files folder, what the one line must name)
    ("penalties --out {d}/afile", "--out"),
    ("penalties --out {d}/p --points 0", "--points"),
    ("penalties --out {d}/p --w-min 3 --w-max 1", "--w-min"),
    ("penalties --out {d}/p --penalties nope", "unknown penalty"),
    ("demo --out {d}/afile/x", "--out"),
    ("demo --seed -1 --out {d}/demo", "--seed"),
    ("fit --synthetic 40,5 --seed -1", "--seed"),
    ("fit --synthetic 40,x", "--synthetic"),
    ("fit --synthetic 40,5 --alpha -1", "--alpha"),
    ("fit --synthetic 40,5 --tol 0", "--tol"),
    ("fit --synthetic 40,5 --out {d}/afile", "--out"),
    ("fit --synthetic 40,5 --path 3", "--path"),
    ("fit --data {d}/missing.csv", "--data"),
    ("fit --data {d}", "--data"),
    ("fit --data {d}/corrupt.npz", "--data"),
    ("fit --data {d}/header_only.csv", "1 sample"),
    ("fit --data {d}/badrow.csv", "line 2"),
    ("fit --data {d}/ok.csv --target 99", "--target 99"),
    ("fit --data {d}/header.csv --target zz", "--target"),
    ("sparsify --method logsum --seed -1 --out {d}/s", "--seed"),
    ("sparsify --method logsum --threads -1 --out {d}/s", "--threads"),
    ("sparsify --method logsum --epochs 0 --out {d}/s", "--epochs"),
    ("sparsify --method logsum --target-density 1.5 --out {d}/s", "--target-density"),
    ("sparsify --method magnitude --select-tol-margin 0.01 --out {d}/s", "--select-tol-margin"),
    ("sparsify --method none --select-tol-margin 0.01 --out {d}/s", "--select-tol-margin"),
    ("sparsify --method logsum --hp oops --out {d}/s", "--hp"),
    ("sparsify --method bogus --out {d}/s", "bogus"),
    ("compare --methods logsum --seeds -1 --out {d}/c", "--seeds"),
    ("compare --methods logsum --threads -1 --out {d}/c", "--threads"),
    ("compare --report-only --out {d}/empty", "no runs"),
    ("frontier --methods logsum --n-trials 0 --out {d}/f", "--n-trials"),
    ("frontier --methods logsum --workers 0 --out {d}/f", "--workers"),
    ("frontier --methods logsum --tols 0.5 --out {d}/f", "--tols"),
    ("frontier --methods logsum --epochs 1 --out {d}/afile --no-progress", "--out"),
    ("frontier --methods logsum --epochs 1 --out {d}/frontier --no-progress", "study journal"),
    ("diagnose {d}/norun --out {d}/dg", "checkpoint"),
    ("diagnose {d}/norun --out {d}/dg --k 0", "--k"),
    ("diagnose {d}/norun --out {d}/dg --n-samples 0", "--n-samples"),
    ("diagnose {d}/norun --out {d}/dg --noise-samples 1", "--noise-samples"),
    ("diagnose {d}/norun --out {d}/dg --noise-samples 0", "--noise-samples"),
    ("diagnose {d}/norun --out {d}/dg --threads 0", "--threads"),
    ("diagnose {d}/norun --out {d}/afile", "--out"),
    ("prune --from {d}/norun --seed -1 --density 0.5 --out {d}/pr", "--seed"),
    ("prune --from {d}/norun --calib 0 --density 0.5 --out {d}/pr", "--calib"),
    ("prune --from {d}/norun --density 0.5 --out {d}/pr", "norun"),
    ("bogus", "bogus"),
    ("fit --bogus 1 --synthetic 40,5", "--bogus"),
]


@pytest.mark.parametrize("argv, names", BAD, ids=[a for a, _ in BAD])
def test_a_bad_option_is_one_line_naming_it_and_exit_2(files, capsys, argv, names):
    rc, err = run(argv.format(d=files).split(), capsys)
    assert rc == 2, err
    assert len(err) == 1 and err[0].startswith("dualdrop") and "error" in err[0], err
    assert names in err[0], err
    assert "Traceback" not in err[0]


def test_the_csv_header_is_read_as_column_names(files, capsys):
    rc = main(["fit", "--data", str(files / "header.csv"), "--target", "target"])
    out = capsys.readouterr().out
    assert rc == 0 and "header of column names; target column 'target', features a, b" in out
    assert "data: n=4 p=2" in out  # the header row is not a sample; no row is dropped
    rc = main(["fit", "--data", str(files / "header.csv"), "--target", "a"])
    assert rc == 0 and "target column 'a'" in capsys.readouterr().out
    assert main(["fit", "--data", str(files / "ok.csv"), "--target", "-3"]) == 0
    assert "data: n=4 p=2" in capsys.readouterr().out


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="permissions do not bind root")
def test_an_out_folder_without_write_permission(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        rc, err = run(["penalties", "--out", locked / "sub"], capsys)
    finally:
        locked.chmod(0o700)
    assert rc == 2 and len(err) == 1 and "--out" in err[0] and "not writable" in err[0]


def test_an_os_error_is_named_by_the_option_holding_its_path(tmp_path, capsys, monkeypatch):
    import penalties.curves as curves

    def denied(out, *a, **k):
        raise PermissionError(13, "Permission denied", str(Path(out) / "penalties.png"))

    monkeypatch.setattr(curves, "penalty_figure", denied)
    rc, err = run(["penalties", "--out", tmp_path / "p"], capsys)
    assert rc == 2 and err == [f"dualdrop penalties: error: --out {tmp_path / 'p' / 'penalties.png'}"
                               ": Permission denied"]


def test_usage_error_names_its_option_once():
    assert str(UsageError("must be > 0", "--k")) == "--k: must be > 0"
    assert str(UsageError("--k must be > 0", "--k")) == "--k must be > 0"
    assert isinstance(UsageError("x"), ValueError)


def test_debug_variable_shows_the_traceback(files, capsys, monkeypatch):
    monkeypatch.setenv("DUALDROP_TRACEBACK", "1")
    with pytest.raises(UsageError):
        main(["fit", "--data", str(files / "ok.csv"), "--target", "99"])


# ------------------------------------------------------------------------------------------------
# Ctrl-C: one line, how to continue, exit 130, for every subcommand
# ------------------------------------------------------------------------------------------------
def _interrupt(*a, **k):
    raise KeyboardInterrupt


INTERRUPTS = [  # (argv, module, attribute that does the work, what the line must say)
    ("penalties --out {d}/pi", "penalties.curves", "penalty_figure", "again"),
    ("demo --out {d}/di", "penalties.curves", "penalty_figure", "again"),
    ("fit --synthetic 40,5 --path 4 --out {d}/fi", "dualdrop.linear", "regularization_path",
     "again"),
    ("sparsify --method logsum --epochs 1 --out {d}/si", "dualdrop.train", "train",
     "continue with: dualdrop sparsify"),
    ("compare --methods logsum --epochs 1 --out {d}/ci", "dualdrop.train.experiments.compare",
     "run_comparison", "same command"),
    ("frontier --methods logsum --epochs 1 --out {d}/fri",
     "dualdrop.train.experiments.frontier", "run_frontier", "same command"),
    ("diagnose {d}/norun --out {d}/dgi", "dualdrop.cli.diagnose_cmd", "load_training_network",
     "again"),
    ("prune --from {d}/norun --density 0.5 --out {d}/pri", "dualdrop.nn.oneshot.job", "make_job",
     "again"),
]


@pytest.mark.parametrize("argv, module, attr, says", INTERRUPTS,
                         ids=[a.split()[0] for a, *_ in INTERRUPTS])
def test_ctrl_c_is_one_line_with_how_to_continue(files, capsys, monkeypatch, argv, module, attr,
                                                 says):
    import importlib

    monkeypatch.setattr(importlib.import_module(module), attr, _interrupt)
    rc, err = run(argv.format(d=files).split(), capsys)
    cmd = argv.split()[0]
    assert rc == 130 and len(err) == 1, err
    assert err[0].startswith(f"dualdrop {cmd}: interrupted; ") and says in err[0], err


def test_ctrl_c_during_a_fit_path_in_a_real_process(tmp_path):
    """SIGINT while ``fit --path`` runs: one line, exit 130, coef.csv complete (it used to
    print a traceback)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dualdrop", "fit", "--synthetic", "400,3000", "--path", "400",
         "--penalty", "mcp:a=3,lam=0.1", "--tol", "1e-10", "--out", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    for line in proc.stdout:  # the path starts once coef.csv is written
        if line.startswith("wrote"):
            break
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    lines = err.strip().splitlines()
    assert proc.returncode == 130, err
    assert len(lines) == 1 and lines[0].startswith("dualdrop fit: interrupted; "), err
    assert np.loadtxt(tmp_path / "coef.csv", delimiter=",", skiprows=1,
                      usecols=1).shape == (3001,)  # 3000 features and the intercept
    assert not (tmp_path / "path.csv").exists() and not list(tmp_path.glob(".*.tmp"))


def test_ctrl_c_inside_llvmlite_code_is_delivered_after_it():
    """An interrupt that lands while llvmlite's Python code runs (a ctypes callback swallows it)
    is re-sent once that code has returned, so the command still stops."""
    from dualdrop.cli import _interrupts_outside_llvm

    namespace = {}
    exec(compile("def busy(seconds):\n"
                 "    import os, signal, time\n"
                 "    os.kill(os.getpid(), signal.SIGINT)\n"
                 "    end = time.perf_counter() + seconds\n"
                 "    while time.perf_counter() < end:\n"
                 "        pass\n"
                 "    return 'returned'\n",
                 "/site-packages/llvmlite/binding/fake.py", "exec"), namespace)
    t0, returned, raised_at = time.perf_counter(), None, None
    with _interrupts_outside_llvm():
        try:  # the whole body, so that an early re-send is caught and not a lost `end`
            returned = namespace["busy"](0.1)
            end = t0 + 5
            while time.perf_counter() < end:
                time.sleep(0.001)
        except KeyboardInterrupt:
            raised_at = time.perf_counter()
    assert returned == "returned"  # not raised inside llvmlite's frame
    assert raised_at is not None and raised_at - t0 < 3  # re-sent soon after, not at the end
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_deferred_at_the_very_end_is_not_lost():
    """An interrupt deferred out of llvmlite's code just before the command ends is raised when
    the command leaves the guard, and nothing arrives after it."""
    from dualdrop.cli import _interrupts_outside_llvm

    namespace = {}
    exec(compile("def busy():\n"
                 "    import os, signal\n"
                 "    os.kill(os.getpid(), signal.SIGINT)\n"
                 "    return 'returned'\n",
                 "/site-packages/llvmlite/binding/fake.py", "exec"), namespace)
    with pytest.raises(KeyboardInterrupt):
        with _interrupts_outside_llvm():
            assert namespace["busy"]() == "returned"
    time.sleep(5 * _interrupts_outside_llvm.RETRY_S)  # the deferred re-send was cancelled
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
