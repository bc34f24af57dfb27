"""Kimi-K3's parsers on every output shape (tests/support/kimi_k3_shapes.py):
the real parser classes of the patched tree, composed as vLLM's serving
layer composes them, through the non-streaming path and through streaming
cut at every token boundary and at seeded random multi-token boundaries.
What a client receives must be the shape's expected outcome, so streaming
and non-streaming agree.

The same cases run on the installed vLLM's own parser files (a pristine
copy of 0.27.1 or 0.32.0): the shapes that release gets wrong must fail
there (strict xfail), the rest must pass."""

import pytest
from support.kimi_k3_parsers import (
    every_token,
    non_streaming,
    parser_classes,
    random_sizes,
    streaming,
)
from support.kimi_k3_shapes import PRISTINE_WRONG, SHAPES
from support.vllm_trees import installed_root, patched_tree

pytestmark = pytest.mark.every_line

SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def patched():
    return parser_classes(patched_tree(), "patched")


@pytest.fixture(scope="module")
def pristine():
    return parser_classes(installed_root(), "pristine")


@pytest.mark.parametrize("name", SHAPES)
def test_non_streaming(patched, name):
    shape = SHAPES[name]
    assert non_streaming(patched, shape.text, shape.thinking) == shape.expected


@pytest.mark.parametrize("name", SHAPES)
def test_streaming_every_token_boundary(patched, name):
    shape = SHAPES[name]
    got = streaming(patched, shape.text, every_token, shape.thinking)
    assert got == shape.expected


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", SHAPES)
def test_streaming_random_boundaries(patched, name, seed):
    shape = SHAPES[name]

    def sizes(ids):
        return random_sizes(ids, seed)

    assert streaming(patched, shape.text, sizes, shape.thinking) == shape.expected


def _pristine_case(name, path):
    why = PRISTINE_WRONG.get((name, path))
    marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
    return pytest.param(name, path, marks=marks, id=f"{name}-{path}")


PRISTINE_CASES = [
    _pristine_case(name, path)
    for name in SHAPES
    for path in ("non-streaming", "streaming")
]


@pytest.mark.parametrize(("name", "path"), PRISTINE_CASES)
def test_the_releases_own_parsers(pristine, name, path):
    shape = SHAPES[name]
    if path == "non-streaming":
        got = non_streaming(pristine, shape.text, shape.thinking)
    else:
        # Upstream re-parses the whole text every delta: 100 KB at every
        # token would take minutes, so its deltas are up to 2,000 tokens long.
        def sizes(ids):
            return random_sizes(ids, 0, most=2000 if len(ids) > 5000 else 8)

        got = streaming(pristine, shape.text, sizes, shape.thinking)
    assert got == shape.expected
