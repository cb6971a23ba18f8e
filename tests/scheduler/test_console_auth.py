"""The console on its own port, behind its token: without it a 401 that
says how to pass it; with it (bearer header, or the cookie the page's
``?token=`` sets once) the page and the API answer; with no token configured
it serves no one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from hcs_bus.bus import Bus
from hcs_bus.settings import load, redacted
from tests.scheduler.conftest import Start

TOKEN = "s3cret-console-token"


async def _get(
    port: int, path: str, *, headers: dict[str, str] | None = None, **kw: Any
) -> tuple[int, Any, Any]:
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.get(f"http://127.0.0.1:{port}{path}", **kw) as resp:
            text = await resp.text()
            body = json.loads(text) if resp.content_type == "application/json" else text
            return resp.status, body, resp.headers


async def _console_port(bus: Bus, start: Start, **cfg: Any) -> int:
    sched = await start(bus, **cfg)
    assert sched.console_port is not None and sched.console_port != sched.port
    return sched.console_port


async def test_a_request_without_the_token_is_a_401_saying_how_to_pass_it(
    bus: Bus, start_scheduler: Start
) -> None:
    port = await _console_port(bus, start_scheduler, console_token=TOKEN)
    with capture_logs() as logs:
        status, body, headers = await _get(port, "/api/overview")
        assert status == 401 and body["status"] == 401
        assert "Authorization: Bearer" in body["error"] and "?token=" in body["error"]
        assert headers["WWW-Authenticate"].startswith("Bearer")
        status, page, _ = await _get(port, "/console/")
        assert status == 401 and "/console/?token=TOKEN" in page
        wrong = {"Authorization": "Bearer nope"}
        status, body, _ = await _get(port, "/api/overview", headers=wrong)
        assert status == 401 and "wrong" in body["error"]
        status, _, _ = await _get(port, "/api/nope")  # no route is revealed either
        assert status == 401
    reasons = [e["reason"] for e in logs if e["event"] == "console_refused"]
    assert reasons == ["no_token", "no_token", "wrong_token", "no_token"]
    assert all(TOKEN not in json.dumps(e, default=str) for e in logs)


async def test_the_bearer_token_opens_the_api_and_the_page(
    bus: Bus, start_scheduler: Start
) -> None:
    port = await _console_port(bus, start_scheduler, console_token=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    status, doc, _ = await _get(port, "/api/overview", headers=auth)
    assert status == 200 and "nodes" in doc
    status, page, _ = await _get(port, "/console/", headers=auth)
    assert status == 200 and "<title>HCS compute pool</title>" in page


async def test_the_page_opened_with_the_token_sets_a_cookie_the_api_then_accepts(
    bus: Bus, start_scheduler: Start
) -> None:
    port = await _console_port(bus, start_scheduler, console_token=TOKEN)
    jar = aiohttp.CookieJar(unsafe=True)  # keeps cookies for an IP address, as a browser does
    async with aiohttp.ClientSession(cookie_jar=jar) as browser:
        base = f"http://127.0.0.1:{port}"
        async with browser.get(f"{base}/console?token={TOKEN}") as page:
            assert page.status == 200 and page.url.path == "/console/"
            cookie = page.history[0].headers.get("Set-Cookie") or page.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" not in cookie
        async with browser.get(f"{base}/api/overview") as api:
            assert api.status == 200
        async with browser.get(f"{base}/console/static/console.js") as script:
            assert script.status == 200
    status, _, _ = await _get(port, "/api/overview", params={"token": TOKEN})
    assert status == 401  # the API takes the header or the cookie, never the query


async def test_a_console_without_a_token_configured_serves_no_one(
    bus: Bus, start_scheduler: Start, tmp_path: Path
) -> None:
    missing = tmp_path / "absent"
    port = await _console_port(bus, start_scheduler, console_token_file=str(missing))
    status, body, _ = await _get(port, "/api/overview", headers={"Authorization": "Bearer x"})
    assert status == 401 and "no token configured" in body["error"]


@pytest.mark.parametrize("content", [f"{TOKEN}\n", f"{TOKEN}\nsecond line ignored\n"])
async def test_the_token_file_holds_the_token_on_its_first_line(
    bus: Bus, start_scheduler: Start, tmp_path: Path, content: str
) -> None:
    file = tmp_path / "token"
    file.write_text(content)
    port = await _console_port(bus, start_scheduler, console_token_file=str(file))
    status, _, _ = await _get(port, "/api/overview", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200


def test_the_console_token_never_prints_with_the_settings() -> None:
    settings = load(env={"HCS_SCHEDULER__CONSOLE_TOKEN": TOKEN})
    assert settings.scheduler.console_token == TOKEN  # still usable
    for shown in (repr(settings), f"{settings.scheduler}", str(redacted(settings))):
        assert TOKEN not in shown
