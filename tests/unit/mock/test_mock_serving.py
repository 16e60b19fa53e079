"""Running the mock: in the current loop, in a thread, and as a process."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from tollway.mock import MockServer, MockServerThread
from tollway.mock.__main__ import main

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
OPENAI = {"model": "mock-gpt", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}
ANTHROPIC = {"model": "mock-claude", "max_tokens": 10, "messages": [{"role": "user", "content": "c"}]}


async def test_mock_server_stops_serving_on_exit() -> None:
    async with MockServer() as server, httpx.AsyncClient() as http:
        url = server.base_url
        assert url.startswith("http://127.0.0.1:")
        assert (await http.get(url + "/_mock/health")).status_code == 200

    with pytest.raises(RuntimeError):
        _ = server.base_url
    async with httpx.AsyncClient() as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(url + "/_mock/health")


def test_mock_server_thread_serves_synchronous_callers() -> None:
    with MockServerThread() as server:
        response = httpx.post(server.base_url + CHAT, json=OPENAI)
        log = server.app.requests

    assert response.json()["choices"][0]["message"]["content"] == "Mock reply #1: b"
    assert [r["model"] for r in log] == ["mock-gpt"]
    with pytest.raises(RuntimeError):
        _ = server.base_url


def test_only_loopback_hosts_are_accepted() -> None:
    with pytest.raises(ValueError, match="loopback"):
        MockServerThread(host="0.0.0.0").start()
    with pytest.raises(SystemExit) as exited:
        main(["--host", "0.0.0.0"])

    assert exited.value.code == 2


def test_module_entry_point_prints_its_url_and_serves() -> None:
    command = [sys.executable, "-m", "tollway.mock", "--host", "127.0.0.1", "--port", "0"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline().strip()
            url = line.removeprefix("mock listening on ")
            response = httpx.post(url + MESSAGES, json=ANTHROPIC, timeout=5)
        finally:
            process.terminate()
            process.wait(timeout=5)

    assert line.startswith("mock listening on http://127.0.0.1:")
    assert response.status_code == 200
    assert response.json()["content"] == [{"type": "text", "text": "Mock reply #1: c"}]
