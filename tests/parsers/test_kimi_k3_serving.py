"""End to end through vLLM's chat-completions serving layer
(`OpenAIServingChat` with `--reasoning-parser kimi_k3 --tool-call-parser
kimi_k3 --enable-auto-tool-choice`, built in-process on the patched tree):
what a client receives, the response's message or the SSE chunks' deltas,
for the output shapes of tests/support/kimi_k3_shapes.py, streaming and not,
with tool_choice auto and required. The same requests through vLLM 0.27.1's
own parser files (composed as ParserManager composes them) must fail where
upstream says 0.27.1 is wrong, and only there.

The engine is a stand-in (`ScriptedEngine`): the tiny CPU model cannot
write Kimi-K3's markers, so it returns a shape's tokens as the engine's
outputs would carry them (whole, or a delta a step). Everything from those
outputs to the client's JSON is vLLM's own code."""

import asyncio
import json
from types import SimpleNamespace

import pytest
from support.kimi_k3_parsers import (
    PROMPT,
    TOOLS,
    Outcome,
    deltas,
    parser_classes,
    random_sizes,
)
from support.kimi_k3_shapes import PRISTINE_WRONG, SHAPES
from support.kimi_k3_tokenizer import kimi_k3_tokenizer
from support.vllm_trees import installed_root

from k3rocm.tryout.tiny_model import build_tiny_llama

pytestmark = pytest.mark.every_line

MODEL = "kimi-k3"
TOOL_CHOICES = ("auto", "required")


class ScriptedEngine:
    """Stands in for vLLM's engine client: generate() yields a scripted
    output, a delta a step when streaming (the engine's DELTA output kind),
    else the whole output once finished."""

    errored = False
    input_processor = None
    vllm_config = None

    def __init__(self, model_config):
        self.model_config = model_config
        # vLLM 0.32.0's serving layer takes its parsers' tokenizer from the
        # engine's renderer when it is built (0.27.1 reads none).
        self.renderer = SimpleNamespace(tokenizer=kimi_k3_tokenizer())
        self.script: list[tuple[str, list[int]]] = []

    async def is_tracing_enabled(self) -> bool:
        return False

    async def generate(self, stream: bool):
        from vllm.outputs import CompletionOutput, RequestOutput

        prompt_ids = kimi_k3_tokenizer().encode(PROMPT, add_special_tokens=False)
        steps = (
            self.script
            if stream
            else [
                (
                    "".join(t for t, _ in self.script),
                    [i for _, s in self.script for i in s],
                )
            ]
        )
        for n, (text, ids) in enumerate(steps, 1):
            last = n == len(steps)
            yield RequestOutput(
                request_id="chatcmpl-test",
                prompt=None,
                prompt_token_ids=prompt_ids,
                prompt_logprobs=None,
                outputs=[
                    CompletionOutput(
                        index=0,
                        text=text,
                        token_ids=ids,
                        cumulative_logprob=None,
                        logprobs=None,
                        finish_reason="stop" if last else None,
                    )
                ],
                finished=last,
            )


@pytest.fixture(scope="module")
def engine_and_models(tmp_path_factory):
    from vllm.config import ModelConfig
    from vllm.entrypoints.openai.models.protocol import BaseModelPath
    from vllm.entrypoints.openai.models.serving import OpenAIServingModels

    model_dir = build_tiny_llama(tmp_path_factory.mktemp("k3") / "model")
    kimi_k3_tokenizer().save_pretrained(str(model_dir))
    model_config = ModelConfig(model=str(model_dir), dtype="float32", max_model_len=512)
    engine = ScriptedEngine(model_config)
    return engine, OpenAIServingModels(engine, [BaseModelPath(MODEL, str(model_dir))])


def _serving_chat(engine, models):
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat

    return OpenAIServingChat(
        engine,
        models,
        "assistant",
        online_renderer=None,
        request_logger=None,
        chat_template=None,
        chat_template_content_format="auto",
        reasoning_parser="kimi_k3",
        tool_parser="kimi_k3",
        enable_auto_tools=True,
    )


@pytest.fixture(scope="module")
def serving(engine_and_models):
    engine, models = engine_and_models
    return _serving_chat(engine, models), engine


@pytest.fixture(scope="module")
def pristine_serving(engine_and_models):
    """A serving object whose parser is composed, as ParserManager composes
    it, of the installed vLLM's own parser classes (0.27.1 or 0.32.0)."""
    from vllm.parser.kimi_k3 import KimiK3Parser

    engine, models = engine_and_models
    chat = _serving_chat(engine, models)
    reasoning_cls, tool_cls = parser_classes(installed_root(), "pristine")

    class Parser(KimiK3Parser):
        reasoning_parser_cls = reasoning_cls
        tool_parser_cls = tool_cls

    chat.parser_cls = Parser
    return chat, engine


def _request(tool_choice: str, stream: bool, thinking: bool):
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionRequest,
    )

    return ChatCompletionRequest(
        model=MODEL,
        messages=[{"role": "user", "content": "again"}],
        tools=TOOLS,
        tool_choice=tool_choice,
        stream=stream,
        chat_template_kwargs={"thinking": thinking},
    )


def _calls(tool_calls) -> list[tuple[str, object]]:
    return [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in tool_calls
    ]


async def _complete(chat, engine, request) -> Outcome:
    # Where the serving module has it from (the module moved in 0.32.0).
    from vllm.entrypoints.openai.chat_completion.serving import (
        RequestResponseMetadata,
    )

    kwargs = chat._effective_chat_template_kwargs(request)
    tokenizer = kimi_k3_tokenizer()
    metadata = RequestResponseMetadata(request_id="chatcmpl-test")
    args = (
        request,
        engine.generate(request.stream),
        "chatcmpl-test",
        MODEL,
        [],
        tokenizer,
        metadata,
    )
    if not request.stream:
        parser = chat.parser_cls(tokenizer, request.tools, chat_template_kwargs=kwargs)
        response = await chat.chat_completion_full_generator(*args, parser=parser)
        message = response.model_dump()["choices"][0]["message"]
        return Outcome(
            message.get("reasoning") or None,
            message.get("content") or None,
            _calls(message.get("tool_calls") or []),
        )
    reasoning, content, calls = "", "", {}
    async for event in chat.chat_completion_stream_generator(
        *args, chat_template_kwargs=kwargs
    ):
        data = event.removeprefix("data: ").strip()
        if data == "[DONE]":
            break
        for choice in json.loads(data)["choices"]:
            delta = choice["delta"]
            reasoning += delta.get("reasoning") or ""
            content += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                name, arguments = calls.get(call["index"], ("", ""))
                fn = call.get("function") or {}
                calls[call["index"]] = (
                    name + (fn.get("name") or ""),
                    arguments + (fn.get("arguments") or ""),
                )
    return Outcome(
        reasoning or None,
        content or None,
        [(n, json.loads(a)) for _, (n, a) in sorted(calls.items())],
    )


# The 100 KB shape streams 40,000 SSE chunks: it stays in tests/parsers'
# parser-level suite.
SERVED = [name for name in SHAPES if name != "arguments_100kb"]


def _run(serving, name, tool_choice, stream) -> Outcome:
    chat, engine = serving
    shape = SHAPES[name]
    ids = kimi_k3_tokenizer().encode(shape.text, add_special_tokens=False)
    engine.script = deltas(ids, random_sizes(ids, seed=len(name), most=4))
    request = _request(tool_choice, stream, shape.thinking)
    return asyncio.run(_complete(chat, engine, request))


@pytest.mark.parametrize("stream", [False, True], ids=["full", "stream"])
@pytest.mark.parametrize("tool_choice", TOOL_CHOICES)
@pytest.mark.parametrize("name", SERVED)
def test_what_the_client_receives(serving, name, tool_choice, stream):
    assert _run(serving, name, tool_choice, stream) == SHAPES[name].expected


def _pristine_case(name, tool_choice, stream):
    why = PRISTINE_WRONG.get((name, "streaming" if stream else "non-streaming"))
    marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
    mode = "stream" if stream else "full"
    return pytest.param(
        name, tool_choice, stream, marks=marks, id=f"{name}-{tool_choice}-{mode}"
    )


@pytest.mark.parametrize(
    ("name", "tool_choice", "stream"),
    [
        _pristine_case(name, tool_choice, stream)
        for name in SERVED
        for tool_choice in TOOL_CHOICES
        for stream in (False, True)
    ],
)
def test_what_a_client_receives_from_the_releases_own_parsers(
    pristine_serving, name, tool_choice, stream
):
    assert _run(pristine_serving, name, tool_choice, stream) == SHAPES[name].expected
