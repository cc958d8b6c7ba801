"""The one HTTP client helper: GET with a timeout, telling "nothing answers" apart from an answer."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any


class Unanswered(Exception):
    """Nothing answered: refused, timed out, unresolvable, or not a URL."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes

    @property
    def ok(self) -> bool:
        return self.status == 200

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.body)


def get(url: str, timeout: float = 2.0) -> Answer:
    """GET `url`; an HTTP error status is an Answer too. Raises Unanswered when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return Answer(response.status, response.read())
    except urllib.error.HTTPError as e:
        return Answer(e.code, e.read())
    except (OSError, ValueError) as e:  # URLError, refused, timeout; ValueError: not a URL
        raise Unanswered(f"{url} did not answer: {e}") from e


def answers(url: str, timeout: float = 1.0) -> bool:
    """True if GET `url` answers 200."""
    try:
        return get(url, timeout).ok
    except Unanswered:
        return False


def get_json(url: str, timeout: float = 2.0) -> Any | None:
    """The JSON body of a 200 answer; None when nothing answers, the status isn't 200 or the body isn't JSON."""
    try:
        answer = get(url, timeout)
        return answer.json() if answer.ok else None
    except (Unanswered, ValueError):
        return None
