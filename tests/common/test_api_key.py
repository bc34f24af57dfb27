"""The one API key reader (k3rocm.common.api_key) and its readers: a key
file named with `~/` reaches every one of them, and a bad file is refused
with one line, the same for all."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k3rocm.common.api_key import ApiKeyFileError, api_key_from_env, read_api_key
from k3rocm.container.watchdog import probe_from_env
from k3rocm.smoke.settings import Settings

KEY = "k3-key-0d9e41"


@pytest.fixture
def home_key(tmp_path, monkeypatch) -> dict[str, str]:
    """A key file at ~/secrets/api-key (HOME is the test's), and the
    environment naming it that way."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "secrets").mkdir()
    key_file = tmp_path / "secrets" / "api-key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    return {"K3_API_KEY_FILE": "~/secrets/api-key"}


def test_a_home_relative_key_file_reaches_every_reader(home_key):
    assert api_key_from_env(home_key) == KEY
    assert Settings.from_env(home_key).api_key == KEY


def test_the_watchdogs_probe_carries_the_key_of_a_home_relative_file(home_key):
    """Before: the watchdog read `~/...` without expanding it, swallowed the
    error and probed without a key (a 401, not a step)."""
    seen: list[str | None] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append(self.headers.get("Authorization"))
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        environ = {
            **home_key,
            "K3_HOST": "127.0.0.1",
            "K3_PORT": str(server.server_port),
        }
        probe = probe_from_env(environ, stall=10)
        probe.send()
        probe.thread.join(10)
    finally:
        server.shutdown()
    assert seen == [f"Bearer {KEY}"]


def test_no_key_file_means_no_key():
    assert api_key_from_env({}) is None


@pytest.mark.parametrize(
    ("content", "mode", "says"),
    [
        (KEY, 0o604, "readable by every user"),
        ("\n", 0o600, "exactly one key"),
        ("two keys", 0o600, "exactly one key"),
        (KEY + "\0x", 0o600, "control character"),
        (b"\xff\xfe", 0o600, "not UTF-8 text"),
        ("k" * (64 * 1024 + 1), 0o600, "more than 65536 bytes"),
    ],
)
def test_a_bad_key_file_is_one_line_saying_how_to_fix_it(tmp_path, content, mode, says):
    key_file = tmp_path / "api-key"
    if isinstance(content, bytes):
        key_file.write_bytes(content)
    else:
        key_file.write_text(content)
    key_file.chmod(mode)
    with pytest.raises(ApiKeyFileError) as raised:
        read_api_key(key_file)
    message = str(raised.value)
    assert says in message and "\n" not in message
    assert "chmod" in message
    # The content may be the key: never quoted.
    assert KEY not in message


def test_a_missing_file_names_the_setting_and_the_way_out(tmp_path):
    with pytest.raises(ApiKeyFileError, match=r"K3_API_KEY_FILE .* not an existing"):
        read_api_key(tmp_path / "absent")


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200))
def test_any_file_content_is_a_key_or_one_line(tmp_path_factory, data):
    key_file = tmp_path_factory.mktemp("key") / "api-key"
    key_file.write_bytes(data)
    key_file.chmod(0o600)
    try:
        key = read_api_key(Path(key_file))
    except ApiKeyFileError as error:
        assert "\n" not in str(error)
        return
    assert key == data.decode().strip()
    assert key and key.isprintable() and not any(c.isspace() for c in key)
