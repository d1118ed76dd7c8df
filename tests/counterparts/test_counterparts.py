"""Self-tests: the counterparts behave as README.md says real servers do."""
import errno
import http.client
import json
import socket
import threading
import time

import pytest

import oai
from launch import free_port, start
from raw_upstream import RawUpstream


def keepalive_get(port, path="/health"):
    """GET on a kept-alive connection; returns (connection, response) with the body read."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    resp = conn.getresponse()
    resp.read()
    return conn, resp


def seconds_until_closed(sock, limit):
    """Waits for the peer to close; returns (seconds, how) with how "fin" or "rst"."""
    sock.settimeout(limit)
    t0 = time.monotonic()
    try:
        data = sock.recv(1)
    except ConnectionResetError:
        return time.monotonic() - t0, "rst"
    assert data == b"", f"unexpected bytes {data!r}"
    return time.monotonic() - t0, "fin"


def raw_exchange(port, data, read_timeout=3.0):
    """Sends raw bytes; returns what arrives until the peer closes or read_timeout (bytes, how)."""
    with socket.create_connection(("127.0.0.1", port), timeout=read_timeout) as s:
        s.sendall(data)
        got = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return got, "fin"
                got += chunk
        except ConnectionResetError:
            return got, "rst"
        except socket.timeout:
            return got, "open"


def wait_for_status(port, path, status, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if oai.get(port, path, timeout=2).status == status:
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


# --- the asyncio model server ----------------------------------------------------------------

@pytest.fixture(scope="module")
def aserver():
    with start("asyncio", "--tokens", "4", "--idle-timeout", "0.5", "--model", "m1") as p:
        yield p


def test_asyncio_endpoints(aserver):
    port = aserver.port
    r = oai.get(port, "/health")
    assert r.status == 200 and r.json() == {"status": "ok"}
    assert r.headers["x-served-by"] == f"{aserver.pid}:{port}"
    assert oai.get(port, "/v1/models").json()["data"][0]["id"] == "m1"
    r = oai.chat(port, model="m1")
    assert r.status == 200 and r.json()["object"] == "chat.completion"
    assert r.text == "tok0 tok1 tok2 tok3 "
    r = oai.completion(port, max_tokens=2)
    assert r.json()["choices"][0]["text"] == "tok0 tok1 "
    r = oai.embeddings(port, ["a", "b"])
    assert [d["index"] for d in r.json()["data"]] == [0, 1]
    r = oai.request(port, "POST", "/v1/chat/completions", b"{not json")
    assert r.status == 400 and "error" in r.json()
    assert oai.get(port, "/nowhere").status == 404


def test_asyncio_stream_has_n_events_then_done(aserver):
    r = oai.chat(aserver.port, stream=True)
    assert r.status == 200
    assert r.headers["content-type"] == "text/event-stream"
    assert r.headers["transfer-encoding"] == "chunked"
    assert len(r.chunks) == 4 and r.done and len(r.events) == 5
    assert r.chunks[-1]["choices"][0]["finish_reason"] == "length"
    r = oai.completion(aserver.port, stream=True, max_tokens=6)
    assert len(r.chunks) == 6 and r.done


def test_asyncio_chunked_request_body_and_connection_close(aserver):
    body = json.dumps({"model": "m1", "max_tokens": 1}).encode()
    req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
           b"Connection: close\r\n\r\n" + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    got, how = raw_exchange(aserver.port, req)
    assert got.startswith(b"HTTP/1.1 200 OK\r\n") and b"connection: close" in got
    assert b'"content":"tok0 "' in got and how == "fin"


def test_asyncio_rejects_malformed_requests(aserver):
    got, how = raw_exchange(aserver.port, b"GARBAGE\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 400 ") and b'"error"' in got and how == "fin"
    got, _ = raw_exchange(aserver.port, b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n"
                                        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 400 ")
    got, _ = raw_exchange(aserver.port, b"POST /v1/completions HTTP/1.1\r\n"
                                        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n")
    assert got.startswith(b"HTTP/1.1 400 ") and b"invalid chunk size" in got


def test_asyncio_closes_idle_keepalive_after_idle_timeout(aserver):
    conn, resp = keepalive_get(aserver.port)
    assert resp.getheader("connection") == "keep-alive"
    conn.request("GET", "/health")  # reused before the timer fires
    assert conn.getresponse().read() == b'{"status":"ok"}'
    elapsed, how = seconds_until_closed(conn.sock, 5)
    conn.close()
    assert how == "fin" and 0.4 <= elapsed <= 1.5


def test_asyncio_faults(aserver):
    got, how = raw_exchange(aserver.port, b"GET /fault/reset HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (got, how) == (b"", "rst")
    with pytest.raises(ConnectionResetError):
        oai.get(aserver.port, "/fault/reset")
    got, how = raw_exchange(aserver.port, b"GET /fault/close HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (got, how) == (b"", "fin")
    assert oai.get(aserver.port, "/fault/status?code=502").status == 502
    stats = oai.stats(aserver.port)
    assert stats["by_path"]["/fault/reset"] == 2
    assert stats["requests"] >= 10 and stats["connections"] >= 10


def test_asyncio_503_while_loading_then_200():
    with start("asyncio", "--load-seconds", "1", "--loading-mode", "503") as p:
        for path in ("/health", "/v1/models"):
            r = oai.get(p.port, path)
            assert r.status == 503 and "error" in r.json()
            assert int(r.headers["retry-after"]) >= 1
        assert oai.chat(p.port).status == 503
        assert wait_for_status(p.port, "/health", 200, 3)
        assert oai.chat(p.port).status == 200


def test_asyncio_bind_late_refuses_then_accepts():
    port = free_port()
    with start("asyncio", "--load-seconds", "1", port=port, wait=False) as p:
        time.sleep(0.3)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        assert p.wait_listening(5) == port
        assert oai.get(port, "/health").status == 200


def test_asyncio_slow_acceptor_and_concurrency_limit():
    with start("asyncio", "--accept-delay-ms", "300", "--max-concurrency", "1",
               "--token-delay-ms", "100", "--tokens", "3") as p:
        results = []

        def one():
            results.append(oai.chat(p.port))

        threads = [threading.Thread(target=one) for _ in range(2)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Connections are taken one at a time: the second waits for the first's delay.
        assert max(r.elapsed for r in results) >= 0.55
        assert time.monotonic() - t0 >= 0.55
        assert sorted(r.status for r in results) == [200, 200]
    with start("asyncio", "--max-concurrency", "1", "--token-delay-ms", "100",
               "--tokens", "5") as p:
        results = []
        threads = [threading.Thread(target=lambda: results.append(oai.chat(p.port)))
                   for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(r.status for r in results) == [200, 429]
        assert oai.stats(p.port)["max_inflight"] == 2


# --- uvicorn ---------------------------------------------------------------------------------

def test_uvicorn_503_while_loading_then_serves():
    with start("uvicorn", "--load-seconds", "1", "--loading-mode", "503", "--tokens", "3") as p:
        r = oai.get(p.port, "/health")
        assert r.status == 503 and r.headers["server"] == "uvicorn"
        assert int(r.headers["retry-after"]) >= 1 and "error" in r.json()
        assert wait_for_status(p.port, "/health", 200, 3)
        r = oai.chat(p.port, stream=True)
        assert r.headers["transfer-encoding"] == "chunked"
        assert len(r.chunks) == 3 and r.done
        assert r.headers["x-served-by"] == f"{p.pid}:{p.port}"
        assert oai.chat(p.port).json()["object"] == "chat.completion"
        assert oai.embeddings(p.port).status == 200
        assert oai.stats(p.port)["requests"] >= 4


def test_uvicorn_bind_late_and_idle_keepalive_closed_after_5s():
    port = free_port()
    with start("uvicorn", "--load-seconds", "0.5", port=port, wait=False) as p:
        time.sleep(0.2)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        p.wait_listening(10)
        conn, resp = keepalive_get(port)
        assert resp.status == 200
        elapsed, how = seconds_until_closed(conn.sock, 10)
        conn.close()
        assert how == "fin" and 4.5 <= elapsed <= 6.5, elapsed


# --- the raw upstream ------------------------------------------------------------------------

def test_raw_ok_stream_and_chunked_body():
    with RawUpstream(keepalive_header=7, stream_events=3, stream_delay_ms=1) as up:
        req = (b"POST /anything HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
               b"Connection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        got, how = raw_exchange(up.port, req)
        assert got.startswith(b"HTTP/1.1 200") and b'"body_bytes": 5' in got and how == "fin"
        r = oai.get(up.port, "/ok")
        assert r.headers["keep-alive"] == "timeout=7" and r.json()["path"] == "/ok"
        r = oai.get(up.port, "/stream")
        assert r.events == ['{"i": 0}', '{"i": 1}', '{"i": 2}', "[DONE]"]
        assert len(oai.get(up.port, "/stream?n=7&delay_ms=0").chunks) == 7
        r = oai.get(up.port, "/trickle?bytes=4&interval_ms=20")
        assert r.body == b"abcd" and r.elapsed >= 0.07
        assert up.requests == 5 and up.paths[0] == "/anything"


def test_raw_reset_is_econnreset():
    with RawUpstream() as up:
        with socket.create_connection(("127.0.0.1", up.port), timeout=3) as s:
            s.sendall(b"GET /reset HTTP/1.1\r\nHost: x\r\n\r\n")
            with pytest.raises(OSError) as err:
                s.recv(1)
            assert err.value.errno == errno.ECONNRESET
        got, how = raw_exchange(up.port, b"GET /reset-mid HTTP/1.1\r\nHost: x\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 200 OK") and got.endswith(b"x" * 100) and how == "rst"
        got, how = raw_exchange(up.port, b"GET /close-before-response HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (got, how) == (b"", "fin")
        assert up.resets == 2 and up.connections == 3


def test_raw_bad_chunk_and_unsolicited_101():
    with RawUpstream() as up:
        with socket.create_connection(("127.0.0.1", up.port), timeout=3) as s:
            s.sendall(b"GET /bad-chunk HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.1)
            first = s.recv(65536)  # the head and the bad size line arrive together
            assert b"Transfer-Encoding: chunked\r\n\r\nzz-not-hex\r\n" in first
        with pytest.raises(http.client.HTTPException):
            conn = http.client.HTTPConnection("127.0.0.1", up.port, timeout=3)
            conn.request("GET", "/bad-chunk")
            conn.getresponse().read()
        got, _ = raw_exchange(up.port, b"GET /upgrade HTTP/1.1\r\nHost: x\r\n\r\n", 0.3)
        assert got.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")


@pytest.mark.parametrize("mode", ["fin", "rst"])
def test_raw_idle_close(mode):
    with RawUpstream(idle_close_ms=300, idle_close_mode=mode) as up:
        conn, resp = keepalive_get(up.port, "/ok")
        assert resp.status == 200
        elapsed, how = seconds_until_closed(conn.sock, 3)
        conn.close()
        assert how == mode and 0.25 <= elapsed <= 1.0
        assert up.idle_closes == 1 and up.resets == (1 if mode == "rst" else 0)


def test_raw_close_after_n_requests():
    with RawUpstream(close_after_n_requests=2) as up:
        conn, _ = keepalive_get(up.port, "/ok")
        conn.request("GET", "/ok")
        resp = conn.getresponse()
        assert resp.getheader("connection") == "keep-alive"  # not announced
        resp.read()
        assert seconds_until_closed(conn.sock, 3)[1] == "fin"
        conn.close()
    with RawUpstream(close_after_n_requests=1, announce_close=True) as up:
        assert oai.get(up.port, "/ok").headers["connection"] == "close"


def test_raw_as_a_script():
    with start("raw", "--idle-close-ms", "200", "--idle-close-mode", "rst") as p:
        conn, _ = keepalive_get(p.port, "/ok")
        assert seconds_until_closed(conn.sock, 3)[1] == "rst"
        conn.close()
        stats = oai.get(p.port, "/__stats").json()
        assert stats["requests"] == 1 and stats["resets"] == 1


def test_raw_stop_is_clean_with_open_connections():
    up = RawUpstream(stream_events=100, stream_delay_ms=20).start()
    conn, resp = oai.open_request(up.port, "GET", "/stream")
    socket.create_connection(("127.0.0.1", up.port)).close()  # connects and leaves at once
    t0 = time.monotonic()
    up.stop()
    assert time.monotonic() - t0 < 2
    conn.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", up.port), timeout=1).close()
