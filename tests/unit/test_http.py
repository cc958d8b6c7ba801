"""The one HTTP helper, against a real server on loopback: an answer, an error status, nothing answering."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from streaming.core import http

pytestmark = pytest.mark.unit


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status, body = {"/ok": (200, b'{"a": 1}'), "/text": (200, b"not json")}.get(self.path, (503, b"busy"))
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def base() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_answer_an_error_status_and_nothing_answering(base: str) -> None:
    assert http.get(f"{base}/ok").json() == {"a": 1}
    busy = http.get(f"{base}/busy")
    assert (busy.status, busy.text(), busy.ok) == (503, "busy", False)
    with pytest.raises(http.Unanswered, match="did not answer"):
        http.get(f"http://127.0.0.1:{_closed_port()}/", timeout=2)
    with pytest.raises(http.Unanswered):
        http.get("not a url")


def test_answers_and_get_json_reduce_to_a_yes_or_a_value(base: str) -> None:
    assert http.answers(f"{base}/ok")
    assert not http.answers(f"{base}/busy")
    assert not http.answers(f"http://127.0.0.1:{_closed_port()}/")
    assert http.get_json(f"{base}/ok") == {"a": 1}
    assert http.get_json(f"{base}/busy") is None
    assert http.get_json(f"{base}/text") is None
