"""Hypothesis profiles for the property-based tests (``tests/*/test_*_hypothesis.py``).

``ci`` (the default): few examples, derandomized, so that the whole property suite runs in well
under a minute and the same examples run everywhere. ``thorough``: many random examples, for a
local hunt; select it with ``DUALDROP_HYPOTHESIS_PROFILE=thorough`` (``dev`` is an alias). A
test's own ``@settings`` still overrides the profile.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=20, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", parent=settings.get_profile("thorough"))
settings.load_profile(os.environ.get("DUALDROP_HYPOTHESIS_PROFILE", "ci"))
