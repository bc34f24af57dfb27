"""The accuracy gate's requests: every generated problem sent through the
OpenAI API with greedy decoding (temperature 0), the reply scored by its final
number (k3rocm.accept.arithmetic)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from k3rocm.accept.arithmetic import INSTRUCTION, Problem, final_number

ENDPOINTS = ("chat", "completions")


@dataclass(frozen=True)
class Answer:
    problem: Problem
    reply: str
    got: int | None
    error: str | None

    @property
    def correct(self) -> bool:
        return self.error is None and self.got == self.problem.answer


def request_body(
    endpoint: str, model: str, problem: Problem, max_tokens: int
) -> tuple[str, dict]:
    """The API path and body of one greedy request."""
    common = {"model": model, "max_tokens": max_tokens, "temperature": 0}
    if endpoint == "chat":
        messages = [{"role": "user", "content": f"{problem.text}\n\n{INSTRUCTION}"}]
        return "/v1/chat/completions", {**common, "messages": messages}
    prompt = f"{INSTRUCTION}\n\nProblem: {problem.text}\nSolution:"
    return "/v1/completions", {**common, "prompt": prompt}


def reply_text(endpoint: str, body: dict) -> str:
    choice = body["choices"][0]
    if endpoint == "chat":
        return choice["message"].get("content") or ""
    return choice.get("text") or ""


def post(url: str, body: dict, api_key: str | None, timeout: float) -> dict:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers=headers
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def ask(
    base_url: str,
    api_key: str | None,
    endpoint: str,
    model: str,
    problem: Problem,
    max_tokens: int,
    timeout: float,
) -> Answer:
    path, body = request_body(endpoint, model, problem, max_tokens)
    try:
        reply = reply_text(endpoint, post(base_url + path, body, api_key, timeout))
    except urllib.error.HTTPError as err:
        detail = err.read()[:200].decode(errors="replace")
        return Answer(problem, "", None, f"HTTP {err.code}: {detail}")
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
        return Answer(problem, "", None, f"{type(err).__name__}: {err}"[:300])
    return Answer(problem, reply, final_number(reply), None)


def ask_all(
    problems: list[Problem],
    concurrency: int,
    ask_one: Callable[[Problem], Answer],
) -> list[Answer]:
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(ask_one, problems))
