"""The smoke test's client of vLLM's API server (stdlib only)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request


class Http:
    def __init__(self, base_url: str, api_key: str | None):
        self.base_url = base_url
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def get(self, path: str, timeout: float = 10) -> tuple[int, str]:
        request = urllib.request.Request(self.base_url + path, headers=self.headers)
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()

    def post(self, path: str, body: dict, timeout: float) -> dict:
        request = urllib.request.Request(
            self.base_url + path, data=json.dumps(body).encode(), headers=self.headers
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def stream(self, path: str, body: dict, timeout: float) -> list[str]:
        """A server-sent event stream's data lines, read to its end; an
        error event raises ValueError."""
        request = urllib.request.Request(
            self.base_url + path, data=json.dumps(body).encode(), headers=self.headers
        )
        events = []
        with urllib.request.urlopen(request, timeout=timeout) as response:
            for raw in response:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data != "[DONE]" and "error" in json.loads(data):
                    raise ValueError(f"error event: {data[:300]}")
                events.append(data)
        return events


def wait_for_health(http: Http, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if http.get("/health", timeout=5)[0] == 200:
                return True
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(2)
    return False
