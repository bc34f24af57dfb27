"""Kimi-K3's reasoning and tool parsers from a vLLM tree, composed the way
vLLM's serving layer composes them (ParserManager's KimiK3Parser, the
parser of `--reasoning-parser kimi_k3 --tool-call-parser kimi_k3`), and
driven through its two paths: `parse` (a whole output, non-streaming) and
`parse_delta` (a stream of deltas, as serving's chat stream calls it).

The parser files are loaded from the tree's own files by path, so the
patched tree and a pristine 0.27.1 copy can be compared in one process (the
rest of vLLM is the patched tree's, which these two files do not change)."""

from __future__ import annotations

import codecs
import importlib.util
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from support.kimi_k3_tokenizer import MARKERS, kimi_k3_tokenizer

REASONING_FILE = "vllm/reasoning/kimi_k3_reasoning_parser.py"
TOOL_FILE = "vllm/tool_parsers/kimi_k3_tool_parser.py"
# What the chat template puts before generation in thinking mode: a prior
# turn with its think channel closed (multi-turn), then the generation
# prefix, which leaves the prompt inside this turn's think channel.
PROMPT = (
    '<|open|>message role="user"<|sep|>hi<|close|>message<|sep|>'
    '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>before'
    "<|close|>think<|sep|><|open|>response<|sep|>ok<|close|>response<|sep|>"
    '<|close|>message<|sep|><|open|>message role="user"<|sep|>again'
    '<|close|>message<|sep|><|open|>message role="assistant"<|sep|>'
    "<|open|>think<|sep|>"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": {}},
        },
    }
    for name in ("get_weather", "run_code", "search")
]


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parser_classes(root: Path, label: str) -> tuple[type, type]:
    """The tree's KimiK3ReasoningParser and KimiK3ToolParser classes."""
    reasoning = _load(root / REASONING_FILE, f"k3_{label}_reasoning_parser")
    tool = _load(root / TOOL_FILE, f"k3_{label}_tool_parser")
    return reasoning.KimiK3ReasoningParser, tool.KimiK3ToolParser


def new_parser(classes: tuple[type, type], thinking: bool = True):
    """A fresh composed parser, as serving makes one per request."""
    from vllm.parser.kimi_k3 import KimiK3Parser

    reasoning_cls, tool_cls = classes

    class Parser(KimiK3Parser):
        reasoning_parser_cls = reasoning_cls
        tool_parser_cls = tool_cls

    return Parser(
        kimi_k3_tokenizer(), TOOLS, chat_template_kwargs={"thinking": thinking}
    )


def chat_request(tool_choice: str = "auto", stream: bool = False):
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionRequest,
    )

    return ChatCompletionRequest(
        model="kimi-k3",
        messages=[{"role": "user", "content": "again"}],
        tools=TOOLS,
        tool_choice=tool_choice,
        stream=stream,
    )


@dataclass
class Outcome:
    """What a client gets: reasoning, content, and each call's name and
    decoded arguments (a streamed call's pieces joined)."""

    reasoning: str | None = None
    content: str | None = None
    calls: list[tuple[str, object]] = field(default_factory=list)


def _or_none(text: str | None) -> str | None:
    return text or None


def non_streaming(classes, text: str, thinking: bool = True) -> Outcome:
    parser = new_parser(classes, thinking)
    reasoning, content, calls = parser.parse(
        text, chat_request(), enable_auto_tools=True
    )
    return Outcome(
        _or_none(reasoning),
        _or_none(content),
        [(c.name, json.loads(c.arguments)) for c in calls or []],
    )


def _byte_of_char() -> dict[str, int]:
    """Byte-level BPE's printable stand-in character for each byte, reversed
    (GPT-2's mapping: printable bytes stand for themselves, the rest are
    shifted past 255 in order)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars = {b: chr(b) for b in printable}
    for shift, b in enumerate(b for b in range(256) if b not in chars):
        chars[b] = chr(256 + shift)
    return {c: b for b, c in chars.items()}


_BYTES = _byte_of_char()


def deltas(ids: list[int], sizes: list[int]) -> list[tuple[str, list[int]]]:
    """The output cut into deltas of *sizes* tokens, each with its text as
    an incremental detokenizer gives it (a character split across tokens
    arrives with the token that completes it)."""
    tokenizer = kimi_k3_tokenizer()
    pieces = tokenizer.convert_ids_to_tokens(ids)
    utf8 = codecs.getincrementaldecoder("utf-8")()
    out, at = [], 0
    for size in sizes:
        chunk = ids[at : at + size]
        raw = b"".join(
            p.encode() if p in MARKERS else bytes(_BYTES[c] for c in p)
            for p in pieces[at : at + size]
        )
        out.append((utf8.decode(raw), chunk))
        at += size
    return out


def every_token(ids: list[int]) -> list[int]:
    return [1] * len(ids)


def random_sizes(ids: list[int], seed: int, most: int = 8) -> list[int]:
    rng, sizes, left = random.Random(seed), [], len(ids)
    while left:
        sizes.append(min(left, rng.randint(1, most)))
        left -= sizes[-1]
    return sizes


def streaming(classes, text: str, sizes_of, thinking: bool = True) -> Outcome:
    """Stream *text*'s tokens through parse_delta in the deltas *sizes_of*
    cuts them into; join what the client receives."""
    tokenizer = kimi_k3_tokenizer()
    ids = tokenizer.encode(text, add_special_tokens=False)
    prompt_ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    parser, request = new_parser(classes, thinking), chat_request(stream=True)
    reasoning, content, calls = "", "", {}
    stream = deltas(ids, sizes_of(ids))
    for n, (delta_text, delta_ids) in enumerate(stream, 1):
        delta = parser.parse_delta(
            delta_text, delta_ids, request, prompt_ids, finished=n == len(stream)
        )
        if delta is None:
            continue
        reasoning += delta.reasoning or ""
        content += delta.content or ""
        for call in delta.tool_calls or []:
            name, args = calls.get(call.index, ("", ""))
            fn = call.function
            calls[call.index] = (
                name + (fn.name or "") if fn else name,
                args + (fn.arguments or "") if fn else args,
            )
    return Outcome(
        _or_none(reasoning),
        _or_none(content),
        [(name, json.loads(args)) for _, (name, args) in sorted(calls.items())],
    )
