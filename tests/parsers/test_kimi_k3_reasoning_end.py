"""The reasoning-end check vLLM's structured-output manager runs every
decode step of a request that is still reasoning
(`is_reasoning_end_streaming(all token ids, this step's ids)`): it must fire
on the step whose token completes the marker that ends reasoning, on every
shape, and read a bounded number of tokens whatever the context length
(0.27.1 inherits a full scan of the context, twice, per step; 0.32.0 has
upstream's bounded check, vLLM #50886)."""

from collections.abc import Sequence

import pytest
from support.kimi_k3_parsers import PROMPT, parser_classes
from support.kimi_k3_shapes import SHAPES
from support.kimi_k3_tokenizer import kimi_k3_tokenizer
from support.vllm_trees import SERIES, installed_root, patched_tree

pytestmark = pytest.mark.every_line

THINKING_SHAPES = [name for name, shape in SHAPES.items() if shape.thinking]


def reasoning_parser(root, label):
    return parser_classes(root, label)[0](kimi_k3_tokenizer())


def encode(text: str) -> list[int]:
    return kimi_k3_tokenizer().encode(text, add_special_tokens=False)


@pytest.mark.parametrize("name", THINKING_SHAPES)
def test_fires_on_the_step_that_ends_reasoning(name):
    shape = SHAPES[name]
    parser = reasoning_parser(patched_tree(), "patched")
    prompt, output = encode(PROMPT), encode(shape.text)
    assert not parser.is_reasoning_end(prompt)
    fired = [
        step
        for step, token in enumerate(output)
        if parser.is_reasoning_end_streaming(prompt + output[: step + 1], [token])
    ]
    if shape.reasoning_ends_after is None:
        assert fired == []
    else:
        assert fired[:1] == [len(encode(shape.reasoning_ends_after)) - 1]


class CountingIds(Sequence):
    """Token ids that count how many of them a check reads."""

    def __init__(self, ids: list[int]):
        self._ids, self.reads = ids, 0

    def __len__(self):
        return len(self._ids)

    def __getitem__(self, index):
        item = self._ids[index]
        self.reads += len(item) if isinstance(index, slice) else 1
        return item

    def __iter__(self):
        for token in self._ids:
            self.reads += 1
            yield token


def _long_context(tokens: int) -> list[int]:
    """A previous turn's closed think channel far back, then this turn
    reasoning: the shape that made 0.27.1 scan everything."""
    head = encode(PROMPT)
    filler = encode(" the weather")
    body = filler * ((tokens - len(head)) // len(filler))
    return head + body


@pytest.mark.parametrize(
    "label",
    [
        "patched",
        pytest.param(
            "pristine",
            marks=pytest.mark.xfail(
                SERIES.vllm_version == "0.27.1",
                strict=True,
                reason="0.27.1 scans the whole context each step",
            ),
        ),
    ],
)
def test_reads_a_bounded_window_at_a_million_tokens(label):
    root = patched_tree() if label == "patched" else installed_root()
    parser = reasoning_parser(root, label)
    context = CountingIds(_long_context(1_000_000))
    assert not parser.is_reasoning_end_streaming(context, [context._ids[-1]])
    assert context.reads <= 16
