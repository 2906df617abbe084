"""The modules moved into dualdrop.train.experiments still import from their old names."""

from __future__ import annotations


def test_old_module_names_are_the_moved_modules_api():
    import dualdrop.train.compare as old_compare
    import dualdrop.train.frontier as old_frontier
    import dualdrop.train.frontier_runs as old_runs
    from dualdrop.train.experiments import compare, frontier
    from dualdrop.train.experiments.frontier import runs

    for old, new in ((old_compare, compare), (old_frontier, frontier), (old_runs, runs)):
        assert old.__all__ == new.__all__
        assert all(getattr(old, name) is getattr(new, name) for name in new.__all__)
