"""Compressed bodies at ``/mutate``: gzip that decodes is read, gzip that does
not gets 400 naming the encoding, and a compression bomb stops at
``max_body_bytes`` with 413. Each refusal is logged once and counted."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import os
import zlib
from collections.abc import Callable
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.injector.conftest import Responder, Webhook, gpu_review
from tests.metering import counted


async def post_encoded(hook: Webhook, body: bytes, encoding: str) -> tuple[int, str]:
    headers = {"Content-Type": "application/json", "Content-Encoding": encoding}
    async with hook.session.post(hook.injector.url, data=body, headers=headers) as resp:
        return resp.status, await resp.text()


async def test_a_gzip_review_is_read_and_answered(webhook: Webhook, responder: Responder) -> None:
    doc = gpu_review()
    status, text = await post_encoded(webhook, gzip.compress(json.dumps(doc).encode()), "gzip")
    assert status == 200, text
    response = json.loads(text)["response"]
    assert response["uid"] == doc["request"]["uid"] and response["allowed"] is True
    assert len(responder.requests) == 1


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        ("gzip", b'{"kind": "AdmissionReview"}'),  # plain JSON, labelled gzip
        ("gzip", os.urandom(200_000)),
        ("gzip", gzip.compress(b'{"kind": "AdmissionReview"}') + b"trailing junk"),
        ("deflate", b"not deflate at all"),
    ],
)
async def test_a_body_that_is_not_what_its_content_encoding_says_gets_400_naming_it(
    webhook: Webhook,
    responder: Responder,
    caplog: pytest.LogCaptureFixture,
    encoding: str,
    body: bytes,
) -> None:
    before = counted("hcs_injector_refusals", reason="bad_encoding")
    with capture_logs() as logs, caplog.at_level(logging.DEBUG, logger="aiohttp"):
        status, text = await post_encoded(webhook, body, encoding)
    assert status == 400, text
    assert f"not valid {encoding}" in text and f"Content-Encoding: {encoding}" in text
    assert counted("hcs_injector_refusals", reason="bad_encoding") == before + 1
    (logged,) = [e for e in logs if e["event"] == "admission_body_refused"]
    assert logged["reason"] == "bad_encoding"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no aiohttp traceback
    # the connection was closed; the next review on the same session is answered
    async with asyncio.timeout(10):
        assert (await webhook.review(gpu_review()))["allowed"] is True


async def test_a_gzip_bomb_stops_at_max_body_bytes_with_413(
    webhook_factory: Callable[..., Any], responder: Responder
) -> None:
    bomb = gzip.compress(b" " * (64 * 1024 * 1024))  # 64 MiB of spaces in ~64 KiB
    assert len(bomb) < 256 * 1024
    before = counted("hcs_injector_refusals", reason="too_large")
    async with webhook_factory(max_body_bytes=256 * 1024) as hook:
        status, text = await post_encoded(hook, bomb, "gzip")
        assert status == 413, text
        assert "262144 bytes" in text and "max_body_bytes" in text
        assert (await hook.review(gpu_review()))["allowed"] is True
    assert counted("hcs_injector_refusals", reason="too_large") == before + 1


async def test_a_deflate_review_is_read_too(webhook: Webhook, responder: Responder) -> None:
    doc = gpu_review()
    status, text = await post_encoded(webhook, zlib.compress(json.dumps(doc).encode()), "deflate")
    assert status == 200 and json.loads(text)["response"]["allowed"] is True
