"""Reading a request body in an aiohttp server: the bytes, or a ``Refusal``.

aiohttp undoes ``Content-Encoding`` (gzip, deflate) while it reads, and holds
the *decoded* size to the application's ``client_max_size``: a compression
bomb stops at the limit. What it raises becomes a ``Refusal`` the server
answers with, never a 500:

- 413 ``too_large``: ``Content-Length``, or the decoded body, over ``limit``;
- 400 ``bad_encoding``: the body is not what its ``Content-Encoding`` says;
- 400 ``unreadable``: the body stopped short or its chunking is broken.

An encoding aiohttp cannot decode at all (``br`` without Brotli) is answered
400 by aiohttp itself, before any handler runs.

After a payload error aiohttp's parser is done with the connection: the
refusal asks for ``Connection: close`` (``close``), and the payload is marked
finished so aiohttp does not read the failed body again once the answer is
sent (it would log that as an unhandled exception).
"""

from __future__ import annotations

import asyncio
from typing import NamedTuple

from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError


class Refusal(NamedTuple):
    """Why a body was not read: HTTP status, a metric label, a message."""

    status: int
    reason: str
    message: str
    close: bool = False

    def response(self) -> web.Response:
        """A ``text/plain`` answer carrying the message."""
        answer = web.Response(status=self.status, text=f"{self.message}\n")
        if self.close:
            answer.force_close()
        return answer


async def read_body(request: web.Request, *, limit: int, setting: str = "") -> bytes | Refusal:
    """The decoded body of ``request``, at most ``limit`` bytes (the app's
    ``client_max_size``; ``setting`` names where it is set); or why not."""
    size = request.content_length
    if size is not None and size > limit:
        return too_large(limit, size=size, setting=setting)
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        return too_large(limit, size=None, setting=setting)
    except web.RequestPayloadError as exc:
        request.content.feed_eof()
        return _payload_refusal(request, exc)
    except (ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
        return Refusal(400, "unreadable", f"truncated or unreadable body: {_root(exc)}", True)


def too_large(limit: int, *, size: int | None, setting: str = "") -> Refusal:
    what = f"the body ({size} bytes)" if size is not None else "the decoded body"
    where = f" ({setting})" if setting else ""
    return Refusal(413, "too_large", f"{what} is over the limit of {limit} bytes{where}")


def _payload_refusal(request: web.Request, exc: web.RequestPayloadError) -> Refusal:
    encoding = request.headers.get("Content-Encoding", "")
    if isinstance(exc.__cause__, ContentEncodingError):
        return Refusal(
            400,
            "bad_encoding",
            f"the body is not valid {encoding or 'encoded data'} "
            f"(Content-Encoding: {encoding}): {_root(exc)}",
            True,
        )
    return Refusal(400, "unreadable", f"truncated or unreadable body: {_root(exc)}", True)


def _root(exc: BaseException) -> str:
    """The innermost cause's message (zlib's, the parser's), on one line."""
    for _ in range(8):  # a chain, never a cycle, but bounded all the same
        inner = exc.__cause__ or exc.__context__
        if inner is None:
            break
        exc = inner
    text = " ".join(str(exc).split()) or exc.__class__.__name__
    return text[:200]
