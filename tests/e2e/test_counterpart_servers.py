"""The process backend against model servers written independently of thaw:
an asyncio server with its own HTTP/1.1 code and a uvicorn app (vLLM's
server), each in both loading modes real servers have (bind only once loaded,
or listen at once and answer 503 while loading)."""

import json
import sys
import threading
import time
from pathlib import Path

import pytest

import httpc

COUNTERPARTS = Path(__file__).resolve().parents[1] / "counterparts"
sys.path.insert(0, str(COUNTERPARTS))
import oai  # noqa: E402

PY = "/usr/bin/python3"
SERVERS = ["asyncio_server.py", "uvicorn_app.py"]
MODES = ["bind-late", "503"]


def counterpart(server, mode, load_s=0.6, name="llama", **kw):
    m = {"name": name,
         "command": [PY, str(COUNTERPARTS / server), "--port", "{port}", "--model", name,
                     "--load-seconds", str(load_s), "--loading-mode", mode,
                     "--token-delay-ms", "40", "--tokens", "5"],
         "idle_timeout_ms": 60000, "startup_timeout_ms": 30000, "stop_grace_ms": 3000,
         "max_concurrency": 64}
    m.update(kw)
    return m


def model_status(t, name="llama"):
    return next(m for m in t.status()["models"] if m["name"] == name)


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("mode", MODES)
def test_cold_start_holds_then_releases_every_request(thaw_factory, server, mode):
    t = thaw_factory({"models": [counterpart(server, mode)]})
    out = [None] * 20

    def one(i):
        out[i] = oai.chat(t.port, model="llama", timeout=60)
    start = time.monotonic()
    ths = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(90)
    assert [r.status for r in out] == [200] * 20, [(r.status, r.body[:200]) for r in out]
    assert time.monotonic() - start >= 0.6
    assert all(r.json()["object"] == "chat.completion" for r in out)
    st = model_status(t)
    assert st["starts"] == 1 and st["replicas_ready"] == 1
    t.assert_reconciled()


@pytest.mark.parametrize("server", SERVERS)
def test_stream_arrives_token_by_token_cold_and_warm(thaw_factory, server):
    t = thaw_factory({"models": [counterpart(server, "503", load_s=0.3)]})
    for _ in range(2):  # cold, then warm
        r = oai.chat(t.port, model="llama", stream=True, timeout=60)
        assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.done and len(r.chunks) == 5
    s = t.connect()
    httpc.send(s, "POST", "/v1/chat/completions", {"Content-Type": "application/json"},
               json.dumps({"model": "llama", "stream": True,
                           "messages": [{"role": "user", "content": "hi"}]}).encode())
    resp = httpc.Reader(s).response()
    times = [c[0] for c in resp.chunks]
    assert times[-1] - times[0] > 0.1  # not buffered: tokens 40 ms apart
    t.assert_reconciled()
