"""What a user is told about a finished run: resuming it with other settings says it is
finished and how to train on from it; a compare folder given to load_run names its runs."""

from __future__ import annotations

import pytest

from dualdrop.train import TrainConfig, load_run, train
from dualdrop.train.experiments.compare import run_comparison


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "run"
    train(TrainConfig(method="logsum", epochs=1, out=str(out), progress=False, threads=1))
    return out


def test_resume_of_a_finished_run_with_more_epochs_says_finished_and_how(finished):
    with pytest.raises(ValueError) as exc:
        train(TrainConfig(method="logsum", epochs=3, out=str(finished), resume=True,
                          progress=False, threads=1))
    msg = str(exc.value)
    assert "finished run" in msg and "1 of 1 epochs" in msg
    assert f"--init-from {finished}" in msg and "load_run" in msg
    assert "configuration differs" not in msg


def test_a_finished_run_without_resume_is_named_finished(finished):
    with pytest.raises(FileExistsError, match="holds a finished run.*--init-from"):
        train(TrainConfig(method="logsum", epochs=1, out=str(finished), progress=False,
                          threads=1))


def test_resume_of_a_finished_run_with_its_settings_still_reports_it(finished):
    report = train(TrainConfig(method="logsum", epochs=1, out=str(finished), resume=True,
                               progress=False, threads=1))
    assert report["status"] == "finished"


def test_load_run_on_a_compare_folder_names_its_runs(tmp_path):
    out = tmp_path / "cmp"
    run_comparison(["logsum"], out=str(out), epochs=1, progress=False)
    with pytest.raises(FileNotFoundError) as exc:
        load_run(out)
    msg = str(exc.value)
    assert "not one run" in msg and repr(str(out / "runs" / "logsum")) in msg
    assert "--resume" not in msg
    assert load_run(out / "runs" / "logsum") is not None
    with pytest.raises(FileNotFoundError, match="does not exist; pass the --out folder"):
        load_run(tmp_path / "missing")
