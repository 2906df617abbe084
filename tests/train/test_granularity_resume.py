"""A run with granularity="neuron" resumes bit for bit (the group paths' noise is keyed too)."""

import pytest


@pytest.mark.parametrize("method", ["vardrop", "vardrop-lr", "hardconcrete", "magnitude",
                                    "eta-trick"])
def test_neuron_run_resumes_exactly(tmp_path, tiny_data, method, assert_resume_exact):
    assert_resume_exact(tmp_path, tiny_data, method=method, hparams={"granularity": "neuron"})
