"""The output shapes Kimi-K3 emits, each with what a client must receive.

Written from the channel grammar (``<|open|>NAME<|sep|> ... <|close|>NAME<|sep|>``
for think, response, tools, call, argument) and the upstream reports named
per shape, not from either parser's behaviour."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from support.kimi_k3_parsers import Outcome
from support.vllm_trees import SERIES

THINK_CLOSE = "<|close|>think<|sep|>"
TOOLS_OPEN, TOOLS_CLOSE = "<|open|>tools<|sep|>", "<|close|>tools<|sep|>"
MESSAGE_CLOSE = "<|close|>message<|sep|>"
RESPONSE_OPEN = "<|open|>response<|sep|>"
# What ends reasoning, first found first: the think close, the think close
# without its <|sep|> before a channel, else a channel opened in its place.
REASONING_ENDS = (THINK_CLOSE, "<|close|>think<|open|>", TOOLS_OPEN, RESPONSE_OPEN)
REASONING = 'The user wants the weather, so I call "get_weather".'


def response(text: str) -> str:
    return f"{RESPONSE_OPEN}{text}<|close|>response<|sep|>"


@dataclass
class Call:
    tool: str
    # (key, type, the value as the template writes it)
    arguments: list[tuple[str, str, str]] = field(default_factory=list)

    def text(self, index: int) -> str:
        args = "".join(
            f'<|open|>argument key="{_escape(key)}" type="{kind}"<|sep|>'
            f"{raw}<|close|>argument<|sep|>"
            for key, kind, raw in self.arguments
        )
        head = f'<|open|>call tool="{self.tool}" index="{index}"<|sep|>'
        return f"{head}{args}<|close|>call<|sep|>"

    def expected(self) -> tuple[str, dict]:
        return self.tool, {
            key: raw if kind == "string" else json.loads(raw)
            for key, kind, raw in self.arguments
        }


def _escape(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;")


def tools(*calls: Call) -> str:
    return TOOLS_OPEN + "".join(c.text(i) for i, c in enumerate(calls, 1)) + TOOLS_CLOSE


WEATHER = Call("get_weather", [("city", "string", "Paris")])
CODE = Call("run_code", [("code", "string", 'print("hi")\nx = 1 & 2')])
SEARCH = Call("search", [("query", "string", "kimi"), ("limit", "integer", "5")])
QUOTING = Call(
    "run_code",
    [
        ("code", "string", 'say "héllo" & <b>日本語</b> 🎉\n\t\\n'),
        ('we"ird&key', "string", "x"),
        (
            "options",
            "object",
            json.dumps(
                {"nested": {"list": [1, 2.5, True, None, '\u00e9"q'], "e": {}}},
                ensure_ascii=False,
            ),
        ),
        ("flags", "array", '[{"a": [[]]}, "b"]'),
    ],
)
BIG = Call("run_code", [("code", "string", "x = 'weather Paris tool call' # " * 3125)])


@dataclass
class Shape:
    text: str
    expected: Outcome
    thinking: bool = True
    # The output's prefix through the marker that ends reasoning (None: it
    # never ends); its last token is where the per-step check must fire.
    reasoning_ends_after: str | None = None

    def __post_init__(self):
        if self.reasoning_ends_after is None and self.thinking:
            for marker in REASONING_ENDS:
                at = self.text.find(marker)
                if at != -1:
                    self.reasoning_ends_after = self.text[: at + len(marker)]
                    break


def _out(reasoning=None, content=None, calls=()) -> Outcome:
    return Outcome(reasoning, content, [c.expected() for c in calls])


SHAPES = {
    "canonical": Shape(
        REASONING
        + THINK_CLOSE
        + response("Checking.")
        + tools(WEATHER)
        + MESSAGE_CLOSE,
        _out(REASONING, "Checking.", [WEATHER]),
    ),
    "canonical_answer": Shape(
        REASONING + THINK_CLOSE + response("Sunny.") + MESSAGE_CLOSE,
        _out(REASONING, "Sunny."),
    ),
    "repeated_think_open": Shape(
        "<|open|>think<|sep|>" + REASONING + THINK_CLOSE + response("Sunny."),
        _out(REASONING, "Sunny."),
    ),
    # vLLM #50258 (fixed by #57098): max_tokens before the think close.
    "truncated_in_think": Shape(REASONING[:30], _out(REASONING[:30])),
    "truncated_in_response": Shape(
        REASONING + THINK_CLOSE + "<|open|>response<|sep|>It is sun",
        _out(REASONING, "It is sun"),
    ),
    "truncated_in_call": Shape(
        REASONING + THINK_CLOSE + response("Checking.") + tools(WEATHER)[:-40],
        _out(REASONING, "Checking."),
    ),
    "truncated_after_a_call": Shape(
        REASONING + THINK_CLOSE + TOOLS_OPEN + WEATHER.text(1) + CODE.text(2)[:50],
        _out(REASONING, None, [WEATHER]),
    ),
    # vLLM #54273 / #53246: the tools channel opened without the think close.
    "skipped_think_close": Shape(
        REASONING + tools(WEATHER), _out(REASONING, None, [WEATHER])
    ),
    "skipped_think_close_to_response": Shape(
        REASONING + response("Sunny.") + MESSAGE_CLOSE, _out(REASONING, "Sunny.")
    ),
    # sglang #32567: the think close without its <|sep|> (after tool results).
    "elided_think_sep": Shape(
        REASONING + "<|close|>think" + tools(WEATHER), _out(REASONING, None, [WEATHER])
    ),
    "elided_think_sep_to_response": Shape(
        REASONING + "<|close|>think" + response("Sunny."), _out(REASONING, "Sunny.")
    ),
    "straight_to_tools": Shape(
        THINK_CLOSE + tools(WEATHER), _out(None, None, [WEATHER])
    ),
    "straight_to_tools_no_think": Shape(tools(WEATHER), _out(None, None, [WEATHER])),
    "several_calls": Shape(
        REASONING + THINK_CLOSE + response("Three.") + tools(WEATHER, CODE, SEARCH),
        _out(REASONING, "Three.", [WEATHER, CODE, SEARCH]),
    ),
    "quotes_unicode_nested_json": Shape(
        REASONING + THINK_CLOSE + tools(QUOTING, WEATHER),
        _out(REASONING, None, [QUOTING, WEATHER]),
    ),
    "arguments_100kb": Shape(
        REASONING + THINK_CLOSE + tools(BIG), _out(REASONING, None, [BIG])
    ),
    "empty_call_list": Shape(
        REASONING + THINK_CLOSE + response("No tool needed.") + tools(),
        _out(REASONING, "No tool needed."),
    ),
    # Thinking off: the prompt ends inside the response channel.
    "thinking_off": Shape(
        "Sunny.<|close|>response<|sep|>" + tools(WEATHER),
        _out(None, "Sunny.", [WEATHER]),
        thinking=False,
    ),
}

# Where upstream says vLLM 0.27.1's parsers are wrong, per shape and path.
_WRONG_IN_0_27_1 = {
    # vLLM #50258 (fixed by #57098): truncated reasoning returned as content.
    ("truncated_in_think", "non-streaming"): "vLLM #50258",
    # vLLM #54273, #53246: the tools block stays in reasoning, no tool call
    # streamed; non-streaming drops the reasoning into content.
    **{
        (shape, path): "vLLM #54273 / #53246"
        for shape in ("skipped_think_close", "skipped_think_close_to_response")
        for path in ("non-streaming", "streaming")
    },
    # vLLM #53246 (its streaming lane): straight to tools, no think close.
    ("straight_to_tools_no_think", "streaming"): "vLLM #53246",
    # sglang #32567: a think close without its <|sep|>.
    **{
        (shape, path): "sglang #32567"
        for shape in ("elided_think_sep", "elided_think_sep_to_response")
        for path in ("non-streaming", "streaming")
    },
}

# 0.32.0 has #57098 (truncated reasoning is reasoning) but none of the
# others; and #57098's rule (a reply with neither think marker is truncated
# reasoning) now returns a reply that goes straight to tools as reasoning,
# without its call, where 0.27.1 got that right without streaming.
_WRONG_IN_0_32_0 = {
    **{
        case: why
        for case, why in _WRONG_IN_0_27_1.items()
        if case != ("truncated_in_think", "non-streaming")
    },
    ("straight_to_tools_no_think", "non-streaming"): "vLLM #57098's no-marker rule",
}

# The cases a release's own parser files get wrong: they must fail there
# (strict xfail), the rest must pass. The installed vLLM's release is tested.
PRISTINE_WRONG = {"0.27.1": _WRONG_IN_0_27_1, "0.32.0": _WRONG_IN_0_32_0}[
    SERIES.vllm_version
]
