"""compare over several seeds: one folder per seed, mean ± sample std in the table."""

from __future__ import annotations

import csv
import json
import statistics

import pytest

from dualdrop.train.experiments.compare import check_seeds, load_runs, run_comparison, run_dir


def test_seeds_layout_and_statistics(tmp_path):
    out = tmp_path / "cmp"
    reps = run_comparison(["logsum", "magnitude"], epochs=1, out=out, progress=False, threads=1,
                          seeds=[0, 1])
    assert set(reps) == {"logsum", "magnitude"} and set(reps["logsum"]) == {0, 1}
    finals = {s: json.loads((run_dir(out, "logsum", s) / "final.json").read_text())
              for s in (0, 1)}
    # different seeds: different initialization, split and noise, so different networks
    assert (finals[0]["test_error"], finals[0]["nonzero_total"]) != (
        finals[1]["test_error"], finals[1]["nonzero_total"])
    runs = load_runs(out, ["logsum", "magnitude"])
    assert sorted(runs["logsum"]["seeds"]) == [0, 1]
    with open(out / "table.csv") as fh:
        rows = {r["method"]: r for r in csv.DictReader(fh)}
    errs = [finals[s]["test_error"] for s in (0, 1)]
    assert float(rows["logsum"]["test_error"]) == pytest.approx(statistics.mean(errs))
    assert float(rows["logsum"]["test_error_std"]) == pytest.approx(statistics.stdev(errs))
    assert rows["logsum"]["n_finished"] == "2"
    md = (out / "table.md").read_text()
    assert "2 of 2" in md and " ± " in md and "sample standard deviation" in md
    assert (out / "figure2.png").stat().st_size > 0


def test_seeds_resume_skips_finished(tmp_path):
    out = tmp_path / "cmp"
    run_comparison(["logsum"], epochs=1, out=out, progress=False, threads=1, seeds=[3])
    stamp = (run_dir(out, "logsum", 3) / "final.json").stat().st_mtime_ns
    run_comparison(["logsum"], epochs=1, out=out, progress=False, threads=1, seeds=[3, 4])
    assert (run_dir(out, "logsum", 3) / "final.json").stat().st_mtime_ns == stamp
    assert (run_dir(out, "logsum", 4) / "final.json").exists()


@pytest.mark.parametrize("bad, exc, word", [
    ([], ValueError, "empty"), ([0, 0], ValueError, "twice"), ([-1], TypeError, "non-negative"),
    (["1"], TypeError, "int"), ([True], TypeError, "int")])
def test_check_seeds_refuses(bad, exc, word):
    with pytest.raises(exc, match=word):
        check_seeds(bad)


def test_seeds_with_one_split_refused(tmp_path, tiny_data):
    with pytest.raises(ValueError, match="seeds="):
        run_comparison(["logsum"], epochs=1, out=tmp_path, data=tiny_data, seeds=[0, 1])


def test_compare_at_matched_density(tmp_path):
    """compare --target-density: every method (with a strength or not) ends at the density."""
    from dualdrop.cli import main

    out = tmp_path / "m"
    assert main(["compare", "--methods", "logsum", "vardrop-lr", "magnitude", "--epochs", "2",
                 "--target-density", "0.1", "--out", str(out), "--no-progress"]) == 0
    for m in ("logsum", "vardrop-lr", "magnitude"):
        final = json.loads((out / "runs" / m / "final.json").read_text())
        assert final["nonzero_total"] == pytest.approx(0.1, rel=0.1), m
        assert json.loads((out / "runs" / m / "config.json").read_text())["target_density"] == 0.1
