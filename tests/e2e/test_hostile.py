"""End-to-end: hostile and malformed clients, over raw sockets.

Secrets must stay out of the log, running out of file descriptors must not spin the loop,
and odd but parseable requests (other HTTP versions, absolute-form targets, forged
forwarding headers, trickled bodies, chunk extensions and trailers) get a defined answer.
"""

import gzip
import json
import os
import resource
import socket
import threading
import time

import pytest

import httpc
from conftest import wait_for


def model(upstream, **kw):
    m = {"name": "model-a", "endpoints": [upstream.address], "max_concurrency": 8}
    m.update(kw)
    return m


@pytest.fixture
def thaw(thaw_factory, upstream):
    return thaw_factory({"models": [model(upstream)]})


def exchange(t, data, pieces=(), pause=0.2, timeout=10):
    """Sends data (then each of pieces after a pause, so each arrives in its own read)
    and returns the response."""
    s = t.connect(timeout=timeout)
    try:
        s.sendall(data)
        for p in pieces:
            time.sleep(pause)
            s.sendall(p)
        return httpc.Reader(s).response()
    finally:
        s.close()


def echoed_headers(r):
    assert r.status == 200, r.body
    return [(k.lower(), v) for k, v in r.json()["headers"]]


# --- secrets stay out of the log --------------------------------------------

def test_rejections_never_log_client_input(thaw_factory, upstream):
    t = thaw_factory({"log": {"access_log": True}, "models": [model(upstream)]},
                     extra_args=("--log-level", "debug"))
    # A bad header line right after the credentials, in a read of its own.
    r = exchange(t, b"GET /v1/models HTTP/1.1\r\nHost: model-a\r\n",
                 [b"Authorization: Bearer SECRET-TOKEN\r\nBad Name: 1\r\n\r\n"])
    assert r.status == 400 and r.json()["error"]["code"] == "bad_request"
    # A bad byte inside the credential's own value.
    r = exchange(t, b"GET /v1/models HTTP/1.1\r\nHost: model-a\r\n",
                 [b"Authorization: Bearer SECRET-TOKEN\x7f\r\n\r\n"])
    assert r.status == 400
    # An API key in the query string of a request with a bad header.
    r = exchange(t, b"GET /v1/x?api_key=SECRET-QUERY HTTP/1.1\r\nHost: model-a\r\n"
                    b"Bad Name: 1\r\n\r\n")
    assert r.status == 400
    # Userinfo in an absolute-form target.
    r = exchange(t, b"GET http://user:SECRET-PASS@model-a/v1/x?k=SECRET-Q HTTP/1.1\r\n"
                    b"Bad Name: 1\r\n\r\n")
    assert r.status == 400
    # Body bytes around a bad chunk.
    r = exchange(t, b"POST /v1/completions HTTP/1.1\r\nHost: model-a\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n",
                 [b"6\r\nSECRET-BODY-BYTES\r\n0\r\n\r\n"])
    assert r.status == 400 and r.json()["error"]["code"] == "bad_chunk"
    t.assert_reconciled()
    logs = t.logs()
    assert "SECRET" not in logs, logs
    rejected = [l for l in logs.splitlines() if "request rejected" in l]
    assert len(rejected) == 5, logs
    assert sum("reason=bad_request" in l for l in rejected) == 4
    assert sum("reason=bad_chunk" in l for l in rejected) == 1
    # Safe facts are there: the path without its query, sizes.
    assert any("path=\"/v1/x\"" in l for l in rejected), rejected
    assert all("head_bytes=" in l for l in rejected), rejected
    assert sum('path="/v1/x"' in l for l in logs.splitlines()) == 4  # fault and access lines
    assert any('parser="a header name is not a token"' in l for l in rejected), rejected


# --- out of file descriptors -------------------------------------------------

def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of the whole line.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def limit_fds(n):
    def apply():
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return apply


def test_out_of_fds_backs_off_without_spinning(thaw_factory, upstream):
    t = thaw_factory({"models": [model(upstream)]}, preexec_fn=limit_fds(128))
    conns = []
    try:
        for _ in range(200):
            conns.append(socket.create_connection(("127.0.0.1", t.admin_port), timeout=10))
        time.sleep(0.5)
        lines_before = t.logs().count("out of file descriptors")
        cpu0, t0 = cpu_seconds(t.proc.pid), time.monotonic()
        time.sleep(3)
        cpu1, t1 = cpu_seconds(t.proc.pid), time.monotonic()
        lines = t.logs().count("out of file descriptors") - lines_before
        share = (cpu1 - cpu0) / (t1 - t0)
        print(f"cpu share while out of fds: {share:.3f}; log lines in 3 s: {lines}")
        assert share < 0.2, f"thaw used {share:.0%} of a CPU while out of file descriptors"
        assert lines <= 5, f"{lines} 'out of file descriptors' lines in 3 s"
    finally:
        for s in conns:
            s.close()
    # Once the descriptors are back, thaw serves again.
    def served():
        try:
            return httpc.request(t.host, t.port, path="/echo",
                                 headers={"Host": "model-a"}, timeout=5).status == 200
        except OSError:
            return False
    wait_for(served, timeout=15, interval=0.2, what="a proxied request after the fd flood")
    assert t.metric("thaw_accept_paused_total") >= 1
    assert "suppressed=" in t.logs()


def completion_request(model="llama"):
    body = json.dumps({"model": model, "prompt": "hi"}).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body)


def fill_admin_port(t, n=80):
    """Admin-port connections (a bound of their own, 256, outside the clients' budget)
    until thaw has no descriptor left; the ones it cannot accept wait in its backlog."""
    conns = [socket.create_connection((t.host, t.admin_port), timeout=5) for _ in range(n)]
    time.sleep(0.3)
    return conns


def test_a_cold_start_gets_its_descriptors_while_clients_flood_in(thaw_factory):
    """100 clients each send a request to a cold process model while thaw has 64 descriptors.
    Before, their connections took every descriptor: the replica's readiness probe found no
    socket (silently), so the model never became ready and the held requests hung, a deadlock
    of thaw's own. Now the descriptor limit caps the client connections (two descriptors
    each, past a reserve): those within it are answered once the model is up, the others at
    once with 503 too_many_connections."""
    from test_process import sim_model
    import threading
    t = thaw_factory({"models": [sim_model(load_ms=200)]}, preexec_fn=limit_fds(64))
    req = completion_request()
    results = []

    def client():
        try:
            with socket.create_connection((t.host, t.port), timeout=8) as s:
                s.sendall(req)
                results.append(httpc.Reader(s).response("POST"))
        except OSError as e:
            results.append(e)
    threads = [threading.Thread(target=client) for _ in range(100)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    unanswered = [r for r in results if isinstance(r, Exception)]
    assert not unanswered and len(results) == 100, f"{len(unanswered)} unanswered: {unanswered[:3]}"
    allowed = t.metric("thaw_max_connections")
    assert 0 < allowed < 100
    # At least the connections within the limit are served once the model is up;
    # on a busy machine clients still connecting when those answers go out take
    # their freed places, and are served too. The rest are refused at once.
    served = sum(r.status == 200 for r in results)
    refused = [r for r in results if r.status == 503]
    assert served >= allowed and served + len(refused) == 100, (served, len(refused))
    assert all(r.json()["error"]["code"] == "too_many_connections" and r.header("retry-after")
               for r in refused)
    assert t.status()["max_connections"] == allowed
    warned = [l for l in t.logs().splitlines() if "allows fewer client connections" in l]
    assert len(warned) == 1 and "max_connections=10000" in warned[0], warned
    assert f"allowed={int(allowed)} nofile=64" in warned[0]


def test_a_probe_that_finds_no_socket_is_logged(thaw_factory):
    """Descriptors run out while a replica loads: its readiness probe cannot open a socket.
    That is logged (at most once a second; before, nothing was), and once descriptors are
    back the probe finds the replica ready and the held request is answered."""
    from test_process import sim_model
    # A load long enough that the descriptors are taken before the replica listens,
    # on a slow machine or under the sanitizers too.
    t = thaw_factory({"models": [sim_model(load_ms=4000)]}, preexec_fn=limit_fds(64))
    s = t.connect()
    admins = []
    try:
        s.sendall(completion_request())
        wait_for(lambda: "starting replica" in t.logs(), timeout=5, what="the replica's start")
        t0 = time.monotonic()
        admins = fill_admin_port(t)
        wait_for(lambda: "no socket for a readiness probe" in t.logs(), timeout=5,
                 what="the probe's failure in the log")
        time.sleep(1)
    finally:
        for c in admins:
            c.close()
    seconds = time.monotonic() - t0
    r = httpc.Reader(s).response("POST")
    s.close()
    assert r.status == 200, r.body
    lines = [l for l in t.logs().splitlines() if "no socket for a readiness probe" in l]
    assert 1 <= len(lines) <= seconds + 1, lines  # once a second at most
    assert "replica=llama-1" in lines[0] and 'error="Too many open files"' in lines[0], lines


def test_the_admin_port_answers_while_clients_hold_every_connection(thaw_factory, upstream):
    """Clients open more connections than thaw's 64 descriptors allow. Before, they took
    every descriptor and the admin port (and its accepts, paused with the proxy's) could
    not answer /healthz: a kubelet would restart thaw for being busy. Now the connection
    limit leaves a reserve, and the first client over it gets its 503 at once."""
    t = thaw_factory({"models": [model(upstream)]}, preexec_fn=limit_fds(64))
    conns = []
    try:
        for _ in range(100):
            conns.append(socket.create_connection((t.host, t.port), timeout=5))
        time.sleep(0.5)
        for path in ("/healthz", "/readyz", "/metrics"):
            r = httpc.request(t.host, t.admin_port, path=path, timeout=3)
            assert r.status == 200, (path, r.body)
        allowed = int(t.metric("thaw_max_connections"))
        assert 0 < allowed < 100
        assert t.metric("thaw_connections") == allowed
        r = httpc.Reader(conns[allowed]).response()
        assert r.status == 503 and r.json()["error"]["code"] == "too_many_connections"
        assert r.header("retry-after") == "1"
    finally:
        for c in conns:
            c.close()
    # Those within the limit are served as ever once the flood is gone.
    wait_for(lambda: t.metric("thaw_connections") == 0, timeout=5, what="the flood's end")
    r = httpc.request(t.host, t.port, path="/echo", headers={"Host": "model-a"}, timeout=5)
    assert r.status == 200


def test_requests_that_find_no_socket_for_a_replica_log_once_a_second(thaw_factory, upstream):
    """Requests that cannot get a socket for their replica (admin connections took the last
    descriptors) are answered 503 too_many_connections, and logged as the accept pause is:
    at most one line a second, with suppressed=N (before, one warn line each: hundreds in a
    burst)."""
    t = thaw_factory({"models": [model(upstream)]}, preexec_fn=limit_fds(64))
    n = int(min(t.metric("thaw_max_connections") or 11, 11))  # within the clients' limit
    clients = [t.connect() for _ in range(n)]
    admins = fill_admin_port(t)
    try:
        req = b"GET /echo HTTP/1.1\r\nHost: model-a\r\n\r\n"
        for c in clients[:-1]:
            c.sendall(req)
        burst = [httpc.Reader(c).response() for c in clients[:-1]]
        time.sleep(1.1)
        clients[-1].sendall(req)
        burst.append(httpc.Reader(clients[-1]).response())
    finally:
        for c in admins + clients:
            c.close()
    assert [r.status for r in burst] == [503] * n
    assert all(r.json()["error"]["code"] == "too_many_connections" for r in burst)
    lines = [l for l in t.logs().splitlines() if "no socket for a replica connection" in l]
    # The burst's first line, and the last request's a second later counting the rest (one
    # more if the burst itself straddled a second).
    assert 2 <= len(lines) <= 3, lines
    assert "model=model-a" in lines[0] and "suppressed=0" in lines[0], lines
    suppressed = [int(l.rsplit("suppressed=", 1)[1].split()[0]) for l in lines]
    assert len(lines) + sum(suppressed) == n, lines


def test_admin_port_has_its_own_connection_limit(thaw):
    held = [socket.create_connection(("127.0.0.1", thaw.admin_port), timeout=10)
            for _ in range(256)]
    try:
        extra = [socket.create_connection(("127.0.0.1", thaw.admin_port), timeout=10)
                 for _ in range(5)]
        for s in extra:
            assert httpc.closed_by_peer(s, timeout=3), "admin connection over the limit kept open"
            s.close()
        for s in held[:10]:
            s.close()

        def counted_down():
            try:
                return thaw.metric("thaw_admin_connections") <= 247
            except OSError:
                return False  # the closes not seen yet: this scrape was over the limit

        wait_for(counted_down, timeout=10, interval=0.1,
                 what="admin connections to be counted down")
    finally:
        for s in held:
            s.close()
    # The proxy port is unaffected.
    r = httpc.request(thaw.host, thaw.port, path="/echo", headers={"Host": "model-a"})
    assert r.status == 200


def test_lingering_connections_are_counted_and_capped(thaw_factory, upstream):
    t = thaw_factory({"models": [model(upstream)]})
    s = t.connect()
    # A bad request answered 400; thaw half-closes and discards input for a moment.
    s.sendall(b"GET / HTTP/1.1\r\nBad Name: 1\r\n\r\n")
    r = httpc.Reader(s).response()
    assert r.status == 400
    assert t.metric("thaw_lingering_connections") == 1
    s.close()
    wait_for(lambda: t.metric("thaw_lingering_connections") == 0, timeout=5,
             what="the lingering connection to end")
    # More bad clients than the cap (1024) that keep their side open: past the
    # cap, connections close at once instead of lingering.
    socks = []
    try:
        for _ in range(1100):
            c = t.connect()
            c.sendall(b"GET / HTTP/1.1\r\nBad Name: 1\r\n\r\n")
            socks.append(c)
        wait_for(lambda: t.metric("thaw_rejections_total", reason="bad_request") == 1101,
                 timeout=20, interval=0.1, what="every bad request answered")
        assert t.metric("thaw_lingering_connections") == 1024
    finally:
        for c in socks:
            c.close()
    wait_for(lambda: t.metric("thaw_lingering_connections") == 0, timeout=10,
             what="the lingering connections to end")


# --- versions, Host --------------------------------------------------------

@pytest.mark.parametrize("version", [b"HTTP/2.0", b"HTTP/3.0", b"HTTP/0.9"])
def test_other_http_versions_are_505(thaw, version):
    r = exchange(thaw, b"GET /echo " + version + b"\r\nHost: model-a\r\n\r\n")
    assert r.status == 505, r.body
    err = r.json()["error"]
    assert err["code"] == "http_version_not_supported" and err["type"] == "server_error"
    thaw.assert_reconciled()


def test_http10_with_two_hosts_is_400(thaw, upstream):
    r = exchange(thaw, b"GET /echo HTTP/1.0\r\nHost: model-a\r\nHost: other\r\n\r\n")
    assert r.status == 400
    assert "Host" in r.json()["error"]["message"]
    assert upstream.requests == 0


@pytest.mark.parametrize("host", [b"[::1", b"::1", b"[::1]:99999", b"a b", b"model-a/x",
                                  b"model-a:80:80", b"user@model-a"])
def test_a_host_that_is_no_host_is_400(thaw, upstream, host):
    """A Host value that is not host[:port] (an unclosed IP literal, a port
    out of range, a path or userinfo in it) is refused, rather than routed
    by whatever part of it looks like a name."""
    r = exchange(thaw, b"GET /echo HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
    assert r.status == 400, r.body
    err = r.json()["error"]
    assert err["code"] == "bad_request" and "Host" in err["message"], err
    assert upstream.requests == 0
    if not any(c in host for c in b" /@"):  # those end (or split off) an authority
        # In absolute form the target's authority is the one that routes.
        r = exchange(thaw, b"GET http://" + host + b"/echo HTTP/1.1\r\nHost: model-a\r\n\r\n")
        assert r.status == 400, r.body
    thaw.assert_reconciled()


def test_absolute_form_authority_replaces_host(thaw):
    r = exchange(thaw, b"GET http://model-a/echo?x=1 HTTP/1.1\r\nHost: other\r\n\r\n")
    seen = echoed_headers(r)
    assert [v for k, v in seen if k == "host"] == ["model-a"]
    assert r.json()["path"] == "/echo?x=1"
    r = exchange(thaw, b"GET http://model-a:80/echo HTTP/1.1\r\nHost: other\r\n\r\n")
    assert [v for k, v in echoed_headers(r) if k == "host"] == ["model-a:80"]
    # Routed by path; userinfo is not part of the Host (nor sent on).
    r = exchange(thaw, b"GET http://user:pw@elsewhere/models/model-a/echo HTTP/1.1\r\n"
                       b"Host: other\r\n\r\n")
    assert [v for k, v in echoed_headers(r) if k == "host"] == ["elsewhere"]
    assert r.json()["path"] == "/echo"
    # Routed by the JSON body: still origin-form upstream.
    body = b'{"model":"model-a"}'
    r = exchange(thaw, b"POST http://elsewhere/v1/completions HTTP/1.1\r\nHost: other\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    assert [v for k, v in echoed_headers(r) if k == "host"] == ["elsewhere"]
    assert r.json()["path"] == "/v1/completions"


def test_a_request_asking_to_upgrade_leaves_the_connection_http(thaw, upstream):
    """thaw upgrades nothing (Upgrade is hop-by-hop): the request is proxied as a
    plain one, and the connection goes on as HTTP/1.1. curl's h2c upgrade
    (`curl --http2 URL URL`) sends exactly this; before, the next request on the
    connection got 400."""
    s = thaw.connect(timeout=10)
    try:
        s.sendall(b"GET /echo HTTP/1.1\r\nHost: model-a\r\nUpgrade: h2c\r\n"
                  b"Connection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAoAAA\r\n\r\n"
                  b"GET /echo?second HTTP/1.1\r\nHost: model-a\r\n\r\n")
        reader = httpc.Reader(s)
        first, second = reader.response(), reader.response()
    finally:
        s.close()
    assert first.status == 200, first.body
    assert not [k for k, _ in echoed_headers(first) if k in ("upgrade", "http2-settings")]
    assert second.status == 200, second.body
    assert second.json()["path"] == "/echo?second"
    assert upstream.requests == 2
    thaw.assert_reconciled()


def test_a_body_in_a_transfer_coding_besides_chunked_is_501(thaw, upstream):
    """thaw takes the chunked framing off a body; a coding under it (gzip) would
    reach the replica as if the body were plain. RFC 9112: 501."""
    coded = gzip.compress(b'{"model":"model-a","prompt":"hi"}')
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(coded), coded)
    for codings in (b"Transfer-Encoding: gzip, chunked\r\n",
                    b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n"):
        r = exchange(thaw, b"POST /v1/completions HTTP/1.1\r\nHost: model-a\r\n" + codings +
                     b"\r\n" + chunked)
        assert r.status == 501, r.body
        assert r.json()["error"]["code"] == "transfer_coding_not_implemented"
    assert upstream.requests == 0
    thaw.assert_reconciled()


def test_error_bodies_stay_json_whatever_bytes_the_client_sent(thaw):
    """The model a client named goes into the 404's message: what is not UTF-8
    (a lone surrogate, escaped or encoded as Python's surrogatepass decodes
    it; bytes in a path) becomes U+FFFD, so OpenAI clients can still decode
    the error. Other bytes that are not UTF-8 in a JSON body make it not
    JSON: 400, the body still JSON."""
    not_found = (404, "model_not_found", "\ufffd")
    not_json = (400, "bad_json", "invalid UTF-8")
    for name, (status, code, text) in [
            (b"m\\ud800", not_found), (b"\\udfff1", not_found), (b"x\\ud83d\\u0041", not_found),
            (b"\xed\xa0\x80x", not_found), (b"m\xff1", not_json), (b"m\xc0\xb1", not_json),
            (b"\xf4\x90\x80\x80", not_json)]:
        body = b'{"model":"' + name + b'"}'
        r = exchange(thaw, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        assert r.status == status, r.body
        err = json.loads(r.body.decode("utf-8"))["error"]
        assert err["code"] == code and text in err["message"], err
    r = exchange(thaw, b"GET /v1/models/%FF%C0 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert r.status == 404
    json.loads(r.body.decode("utf-8"))
    thaw.assert_reconciled()


# --- forwarding headers -----------------------------------------------------

FORGED = (b"X-Forwarded-For: 127.9.8.7\r\nX-Forwarded-Proto: https\r\n"
          b"X-Forwarded-Host: evil.example\r\nForwarded: for=127.9.8.7;proto=https\r\n")


def test_client_forwarding_headers_are_replaced_by_default(thaw):
    r = exchange(thaw, b"GET /echo HTTP/1.1\r\nHost: model-a\r\n" + FORGED + b"\r\n")
    seen = echoed_headers(r)
    assert [v for k, v in seen if k == "x-forwarded-for"] == ["127.0.0.1"]
    assert [v for k, v in seen if k == "x-forwarded-proto"] == ["http"]
    assert not [k for k, v in seen if k in ("forwarded", "x-forwarded-host")], seen


def test_trusted_forwarding_headers_are_appended(thaw_factory, upstream):
    t = thaw_factory({"limits": {"trust_forwarded_headers": True},
                      "models": [model(upstream)]})
    r = exchange(t, b"GET /echo HTTP/1.1\r\nHost: model-a\r\n" + FORGED +
                 b"X-Forwarded-For: 127.1.1.1\r\n\r\n")
    seen = echoed_headers(r)
    assert [v for k, v in seen if k == "x-forwarded-for"] == ["127.9.8.7, 127.1.1.1, 127.0.0.1"]
    assert [v for k, v in seen if k == "x-forwarded-proto"] == ["https"]
    assert [v for k, v in seen if k == "forwarded"] == ["for=127.9.8.7;proto=https"]
    assert [v for k, v in seen if k == "x-forwarded-host"] == ["evil.example"]


# --- bodies -----------------------------------------------------------------

def test_trickled_body_hits_the_total_body_timeout(thaw_factory, upstream):
    t = thaw_factory({"limits": {"body_total_timeout_ms": 2000, "body_timeout_ms": 60000},
                      "models": [model(upstream)]})
    s = t.connect(timeout=10)
    s.sendall(b"POST /echo HTTP/1.1\r\nHost: model-a\r\nContent-Length: 100\r\n\r\n")
    start = time.monotonic()
    s.settimeout(0.1)
    got = b""
    # One byte every 1.5 s: each arrives well within body_timeout_ms.
    while time.monotonic() - start < 8 and not got:
        try:
            s.sendall(b"x")
        except OSError:
            break
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            try:
                d = s.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                break
            got += d
            break
    elapsed = time.monotonic() - start
    s.close()
    assert got.startswith(b"HTTP/1.1 408"), (got, elapsed)
    assert b'"body_timeout"' in got
    assert elapsed < 5
    assert upstream.requests == 0
    t.assert_reconciled()
    assert t.metric("thaw_rejections_total", reason="body_timeout") == 1


CHUNKED_HEAD = b"POST /echo HTTP/1.1\r\nHost: model-a\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_chunk_extensions_are_capped(thaw, upstream):
    small = b"3;name=value\r\nabc\r\n0\r\n\r\n"
    r = exchange(thaw, CHUNKED_HEAD + small)
    assert r.status == 200 and r.json()["body"] == "abc"
    ext = b";e=" + b"a" * 1000
    body = b"".join(b"1" + ext + b"\r\nx\r\n" for _ in range(5)) + b"0\r\n\r\n"
    r = exchange(thaw, CHUNKED_HEAD + body)
    assert r.status == 400, r.body
    assert r.json()["error"]["code"] == "bad_chunk"
    assert upstream.requests == 1
    thaw.assert_reconciled()


def test_chunked_trailers_are_not_forwarded(thaw):
    body = b"3\r\nabc\r\n0\r\nX-Trailer-Field: t\r\nHost: evil\r\n\r\n"
    r = exchange(thaw, CHUNKED_HEAD + body)
    seen = echoed_headers(r)
    assert r.json()["body"] == "abc"
    assert "x-trailer-field" not in [k for k, _ in seen]
    assert [v for k, v in seen if k == "host"] == ["model-a"]


# --- access log -------------------------------------------------------------

def test_access_log_has_no_method_for_unparsed_requests(thaw_factory, upstream):
    t = thaw_factory({"log": {"access_log": True}, "models": [model(upstream)]})
    r = exchange(t, b"\x01BAD / HTTP/1.1\r\n\r\n")
    assert r.status == 400
    t.assert_reconciled()
    lines = [l for l in t.logs().splitlines() if 'msg="request"' in l]
    assert len(lines) == 1, lines
    assert "method=-" in lines[0], lines[0]
    r = exchange(t, b"DELETE /echo HTTP/1.1\r\nHost: model-a\r\n\r\n")
    assert r.status == 200
    wait_for(lambda: "method=DELETE path=\"/echo\" status=200" in t.logs(), timeout=5,
             what="the access log line of a parsed DELETE")


def test_a_client_reset_mid_upload_ends_its_request_at_once(thaw):
    """Clients reset (RST) in the middle of a 1 MiB body routed by its
    `model`, 8 at a time: each request ends as client_closed within a few
    seconds. A reset that came in one readiness report with the last bytes
    was seen as a plain short read; with no new edge after it, the request
    stayed in flight, its body reserved, until body_timeout_ms (60 s)."""
    import random
    import struct
    import threading
    body = json.dumps({"messages": [{"role": "user", "content": "x" * (1 << 20)}],
                       "model": "m"}).encode()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))

    def worker(seed):
        rnd = random.Random(seed)
        for _ in range(30):
            s = socket.create_connection((thaw.host, thaw.port))
            s.sendall(head + body[:rnd.randint(0, len(body) - 1)])
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
    ths = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(60)
    wait_for(lambda: thaw.metric("thaw_aborts_total", reason="client_closed") == 240,
             timeout=5, what="every reset request ended")
    assert thaw.metric("thaw_requests_inflight") == 0
    assert thaw.metric("thaw_buffered_body_bytes") == 0


def test_a_start_that_runs_out_of_descriptors_is_logged(thaw_factory):
    """Every descriptor thaw may have is taken when a request wakes a process
    model: the start fails (no socket for a port, no pipe) and says why in the
    log, once (before, nothing was logged at any level and the request waited
    silently for its queue timeout). Client connections can no longer do that
    (the descriptor budget keeps a reserve), so admin-port connections, which
    have a bound of their own, take the last ones."""
    from test_process import sim_model
    t = thaw_factory({"models": [sim_model(load_ms=50, queue_timeout_ms=2000)]},
                     preexec_fn=limit_fds(40))
    s = socket.create_connection((t.host, t.port))
    s.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 17\r\n\r\n'
              b'{"model":"llama')  # held: its body is not whole yet
    conns = []
    try:
        for _ in range(60):
            try:
                conns.append(socket.create_connection((t.host, t.admin_port), timeout=2))
            except OSError:
                break
        time.sleep(0.5)
        s.sendall(b'"}')
        r = httpc.Reader(s).response()
        assert r.status == 504, r.body
    finally:
        for c in conns:
            c.close()
        s.close()
    logs = t.logs()
    assert logs.count('msg="cannot start a replica" model=llama error="Too many open files"') == 1, \
        logs[-3000:]


def test_queue_timeouts_in_a_burst_are_logged_once_a_second(thaw_factory):
    """40 requests held for a model that never gets ready all reach their queue
    deadline at once: each is answered 504 queue_timeout and counted, and the
    log says so at most once a second with suppressed=N (before, a line each:
    a flood under overload, when the log matters most)."""
    m = {"name": "never", "command": ["/bin/sleep", "60"], "startup_timeout_ms": 60000,
         "queue_timeout_ms": 500, "max_concurrency": 1}
    t = thaw_factory({"models": [m]})
    out = []
    ths = [threading.Thread(target=lambda: out.append(httpc.request(
        t.host, t.port, "GET", "/x", {"Host": "never"}, b"", timeout=30))) for _ in range(40)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(30)
    assert [r.status for r in out] == [504] * 40
    assert all(r.json()["error"]["code"] == "queue_timeout" for r in out)
    lines = [l for l in t.logs().splitlines() if "queue deadline passed" in l]
    assert 1 <= len(lines) <= 2, lines
    suppressed = [int(l.rsplit("suppressed=", 1)[1].split()[0]) for l in lines]
    assert len(lines) + sum(suppressed) <= 40
