"""Resume tokens: a stream (or a realtime session) outlives its client's dropped socket.

A drop and a deliberate close are told apart by the websocket's close: a close frame with code
1000 (normal) or 1001 (going away: the page was closed) is deliberate, and the stream ends as
before; anything else is a drop: the TCP connection lost with no close frame, a close frame
without a status code, another code (an application's 3000-4999, 1011 ...), or a ping the
client never answered. A dropped client's stream is suspended (`EngineThread.suspend_stream`)
for ``window_s`` and can be resumed on a new socket with its token.

`ResumeRegistry` holds the tokens (event-loop thread only). A token:

- is unguessable (``secrets``), and single-use: resuming spends it, and the resumed ``ready``
  carries a new one;
- is bound to the API key its stream was opened with (a minted page token counts as its key):
  presented with another key it is unknown, whether or not it exists;
- is refused once its stream has ended, or once its client has been away for longer than
  ``window_s`` (``resume_expired``); an unknown or spent one is ``resume_invalid``.

Spent and expired tokens are remembered for ``REMEMBER_S`` (at most ``MAX_REMEMBERED``), so
that a replay or a late client gets the precise refusal; after that they are unknown.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

DELIBERATE_CLOSE_CODES = frozenset({1000, 1001})
MAX_TOKEN_CHARS = 128
REMEMBER_S = 600.0
MAX_REMEMBERED = 10_000
RESUME_INVALID = "resume_invalid"
RESUME_EXPIRED = "resume_expired"

Held = TypeVar("Held")


def is_drop(close_code: int | None) -> bool:
    """Whether a socket that ended with ``close_code`` (None: unknown) was dropped rather
    than closed on purpose by its client."""
    return close_code not in DELIBERATE_CLOSE_CODES


class ResumeError(Exception):
    """A resume refused: ``code`` is ``resume_invalid`` or ``resume_expired``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class _Live(Generic[Held]):
    held: Held
    principal: str | None
    away_since: float | None = None  # when its client went away (None: attached)


@dataclass(frozen=True)
class _Gone:
    principal: str | None
    code: str
    message: str
    at: float


class ResumeRegistry(Generic[Held]):
    """Live tokens and the objects they resume; spent ones for a while. Event-loop only.

    Invariant: a held object has at most one live token (`issue` spends the previous one).
    """

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._live: dict[str, _Live[Held]] = {}
        self._token_of: dict[int, str] = {}  # id(held) -> its live token
        self._gone: OrderedDict[str, _Gone] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.window_s > 0

    @property
    def num_away(self) -> int:
        """Held objects whose client is away (suspended, waiting for a resume)."""
        return sum(1 for live in self._live.values() if live.away_since is not None)

    def issue(self, held: Held, principal: str | None) -> str:
        """A new token for ``held`` (its previous one, if any, is spent)."""
        self._spend(held, RESUME_INVALID, "this resume token was already used")
        token = "oasr-resume-" + secrets.token_urlsafe(24)
        self._live[token] = _Live(held, principal)
        self._token_of[id(held)] = token
        return token

    def away(self, held: Held) -> None:
        """``held``'s client went away: its token works for ``window_s`` from now."""
        token = self._token_of.get(id(held))
        if token is not None:
            self._live[token].away_since = self._clock()

    def claim(self, token: object, principal: str | None) -> Held:
        """The object ``token`` resumes; the token is spent.

        Raises:
            ResumeError: the token is unknown, spent, another key's, or its window passed.
        """
        if not isinstance(token, str) or not 0 < len(token) <= MAX_TOKEN_CHARS:
            raise ResumeError(RESUME_INVALID, "'resume' must be the resume_token of a ready "
                              "message (a string)")
        self._forget_old()
        live = self._live.get(token)
        if live is not None and live.principal == principal:
            if live.away_since is not None and \
                    self._clock() - live.away_since > self.window_s:
                self.end(live.held, f"the resume window of {self.window_s:g} s has passed")
                raise ResumeError(RESUME_EXPIRED, self._gone[token].message)
            del self._live[token]
            del self._token_of[id(live.held)]
            self._remember(token, principal, RESUME_INVALID, "this resume token was already used")
            return live.held
        gone = self._gone.get(token)
        if gone is not None and gone.principal == principal:
            raise ResumeError(gone.code, gone.message)
        raise ResumeError(RESUME_INVALID, "unknown resume token")

    def end(self, held: Held, why: str) -> None:
        """``held`` has ended (``why``, for a client that comes back): its token expires."""
        self._spend(held, RESUME_EXPIRED, f"the stream cannot be resumed: {why}")

    def _spend(self, held: Held, code: str, message: str) -> None:
        token = self._token_of.pop(id(held), None)
        if token is None:
            return
        live = self._live.pop(token)
        self._remember(token, live.principal, code, message)

    def _remember(self, token: str, principal: str | None, code: str, message: str) -> None:
        self._gone[token] = _Gone(principal, code, message, self._clock())
        self._gone.move_to_end(token)
        while len(self._gone) > MAX_REMEMBERED:
            self._gone.popitem(last=False)

    def _forget_old(self) -> None:
        horizon = self._clock() - REMEMBER_S
        while self._gone:
            token, gone = next(iter(self._gone.items()))
            if gone.at >= horizon:
                return
            del self._gone[token]
