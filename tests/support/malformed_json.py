"""What the malformed-input tests share: their Hypothesis settings and
strategies for arbitrary JSON."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# Issue 11 asks for at least 500 examples of each property per run.
PROPERTY = settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# Nesting far past Python's recursion limit (1000 by default).
DEEP = 100_000
DEEPLY_NESTED = "[" * DEEP + "]" * DEEP

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)
json_lists = st.lists(json_values, max_size=3)
json_objects = st.dictionaries(st.text(max_size=10), json_values, max_size=3)
json_non_strings = (
    st.none() | st.booleans() | st.integers() | st.floats() | json_lists | json_objects
)


def often(draw) -> bool:
    """True three times in four (Hypothesis leans to the first choice)."""
    return draw(st.sampled_from([True, True, True, False]))
