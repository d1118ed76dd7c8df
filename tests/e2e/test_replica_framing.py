"""End-to-end: model servers that answer in ways well-behaved ones do not, through
scripted_upstream.py (a raw-socket server whose request path picks the exact bytes it
answers) and Python's stdlib http.server: answers before the request body is read,
bodies ended by the close or by a reset, health answers without a length."""

import json
import sys
import time
from pathlib import Path

import httpc

COUNTERPARTS = Path(__file__).resolve().parents[1] / "counterparts"
PY = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
BIG = 12 << 20


def scripted(log, *args, **kw):
    m = {"name": "m", "max_concurrency": 8,
         "command": [PY, str(COUNTERPARTS / "scripted_upstream.py"), "--port", "{port}",
                     "--log", str(log), *args],
         "startup_timeout_ms": 15000, "stop_grace_ms": 1000}
    m.update(kw)
    return m


def log_lines(log):
    try:
        return [json.loads(line) for line in open(log)]
    except FileNotFoundError:
        return []


def post(t, path, body, headers=None, timeout=30):
    return httpc.request(t.host, t.port, "POST", path,
                         {"Host": "m", "Content-Type": "application/json", **(headers or {})},
                         body, timeout=timeout)


def upload():
    return b'{"model":"m","x":"' + b"a" * BIG + b'"}'


def test_an_answer_before_the_whole_body_does_not_let_the_next_request_into_it(thaw_factory,
                                                                              tmp_path):
    """The replica refuses an upload at its head (a 400 on a keep-alive connection) and
    reads the body a second later. Its connection must not be reused while the body is
    still going out: the next request, another client's, was written into the middle
    of the upload, read as body bytes, and answered 504 minutes later."""
    log = tmp_path / "up.log"
    t = thaw_factory({"limits": {"max_body_bytes": 64 << 20},
                      "models": [scripted(log, first_byte_timeout_ms=4000)]})
    r = post(t, "/s/early400_slow/v1/chat/completions", upload())
    assert r.status == 400
    start = time.monotonic()
    victim = httpc.request(t.host, t.port, "GET", "/v1/victim",
                           {"Host": "m", "Authorization": "Bearer VICTIM-SECRET"}, b"",
                           timeout=15)
    assert victim.status == 200 and time.monotonic() - start < 3, victim.status
    time.sleep(1.5)  # the replica reads the upload's body
    lines = log_lines(log)
    assert any(e.get("event") == "req" and e.get("path") == "/v1/victim" for e in lines)
    assert not any("VICTIM-SECRET" in e.get("tail", "") + e.get("lefttext", "")
                   for e in lines if e.get("event") == "early_body")
    t.assert_reconciled()


def test_a_replica_answering_while_it_reads_gets_the_whole_body(thaw_factory, tmp_path):
    """A replica that starts its streamed answer before it has read the upload (an
    echo or transcription server) gets the rest of the body: sending stopped when
    the answer began, and the stream hung until the idle timeout."""
    log = tmp_path / "up.log"
    t = thaw_factory({"limits": {"max_body_bytes": 64 << 20},
                      "models": [scripted(log, upstream_idle_timeout_ms=4000)]})
    body = upload()
    r = post(t, "/s/duplex", body)
    assert r.status == 200 and f"got {len(body)} bytes".encode() in r.body, r.body[-80:]
    t.assert_reconciled()


def test_a_body_ended_by_a_reset_is_cut_not_complete(thaw_factory, tmp_path):
    """A close-delimited answer (no length) ended by a TCP reset rather than a FIN is
    incomplete (RFC 9112, section 8): the client's chunked copy must not get its
    last chunk, and it counts as upstream_closed, not as a 200 served."""
    log = tmp_path / "up.log"
    t = thaw_factory({"models": [scripted(log)]})
    for scenario in ("cd_sse_rst", "close_delim_then_rst"):
        s = t.connect(timeout=15)
        httpc.send(s, "POST", f"/s/{scenario}", {"Host": "m", "Content-Type": "application/json"},
                   b'{"model":"m","stream":true}')
        raw = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            raw += chunk
        s.close()
        assert raw.startswith(b"HTTP/1.1 200") and not raw.endswith(b"\r\n0\r\n\r\n"), raw[-60:]
    time.sleep(0.3)
    assert t.metric("thaw_aborts_total", reason="upstream_closed") == 2
    t.assert_reconciled()


def test_health_answers_without_a_length_after_an_interim_one_or_large_make_a_replica_ready(
        thaw_factory, tmp_path):
    """Python's http.server answers HTTP/1.0 with no Content-Length (the body ends
    with the close), and some servers send 103 Early Hints first: both are a 2xx
    health answer, and so is one with a large body. Such a replica was never taken
    as ready and was killed at its startup timeout."""
    log = tmp_path / "up.log"
    cases = [
        {"name": "m", "command": [PY, str(COUNTERPARTS / "stdlib_http10_server.py"), "{port}"],
         "startup_timeout_ms": 4000, "stop_grace_ms": 1000},
        scripted(log, "--health", "closedelim", startup_timeout_ms=4000),
        scripted(log, "--health", "c103", startup_timeout_ms=4000),
        # A health path that answers with a body over 4 KiB (a model list,
        # say): was an error every time.
        scripted(log, health_path="/s/big_cl?n=20000", startup_timeout_ms=4000),
    ]
    for m in cases:
        t = thaw_factory({"models": [m]})
        r = httpc.request(t.host, t.port, "GET", "/hello", {"Host": "m"}, b"", timeout=15)
        assert r.status == 200, (m["command"][1:], r.status, r.body[:200])
        t.stop()


def test_a_malformed_answer_is_a_502_and_the_log_says_what_was_wrong(thaw_factory, tmp_path):
    """Two Content-Lengths that disagree: 502 upstream_error for the client, and the
    warning names the fault, so an operator need not capture traffic to find it."""
    log = tmp_path / "up.log"
    t = thaw_factory({"models": [scripted(log)]})
    r = httpc.request(t.host, t.port, "GET", "/s/dup_cl_diff", {"Host": "m"}, b"", timeout=15)
    assert r.status == 502 and json.loads(r.body)["error"]["code"] == "upstream_error"
    line = next(ln for ln in t.logs().splitlines() if "upstream failed" in ln)
    assert "error=" in line and "ontent" in line.split("error=", 1)[1], line
    t.assert_reconciled()
