"""End-to-end: large JSON bodies routed by their "model" field, and the
budget for request bodies held in memory."""

import json
import os
import socket
import subprocess
import tempfile
import threading
import time

import pytest

import httpc
from conftest import ROOT, wait_for

SIM = os.environ.get("THAW_SIM_BIN", os.path.join(ROOT, "build", "thaw-model-sim"))
SLOW = 3 if os.environ.get("THAW_SANITIZED") else 1


class Sim:
    """A model-server simulator in its own process (so that serving the large
    body costs the test process nothing)."""

    def __init__(self, name):
        self.dir = tempfile.mkdtemp(prefix="thaw-sim-")
        port_file = os.path.join(self.dir, "port")
        self.proc = subprocess.Popen([SIM, "--port", "0", "--port-file", port_file,
                                      "--model", name, "--load-ms", "0", "--token-ms", "0",
                                      "--tokens", "1"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def port():
            try:
                with open(port_file) as f:
                    return int(f.read().strip() or 0)
            except FileNotFoundError:
                return 0
        self.address = f"127.0.0.1:{wait_for(port, what='sim port')}"

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def sims():
    started = []

    def make(name):
        s = Sim(name)
        started.append(s)
        return s
    yield make
    for s in started:
        s.stop()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def token_ids_body(model, size):
    """An embeddings-style body of about `size` bytes: a long array of small
    numbers (the worst case for a parser that builds a tree), "model" last."""
    tail = json.dumps({"model": model})[1:]
    n = (size - len('{"input":[]') - len(tail) - 1) // 2
    return b'{"input":[' + b"7," * n + b'7],' + tail.encode()


class SmallRequests(threading.Thread):
    """Small requests on one keep-alive connection, back to back, timed."""

    def __init__(self, t, host):
        super().__init__(daemon=True)
        self.t, self.host = t, host
        self.stop = threading.Event()
        self.latencies = []  # (start, seconds)

    def run(self):
        s = self.t.connect()
        rd = httpc.Reader(s)
        while not self.stop.is_set():
            t0 = time.perf_counter()
            httpc.send(s, "GET", "/health", host=self.host)
            r = rd.response()
            assert r.status == 200, r.body
            self.latencies.append((t0, time.perf_counter() - t0))
            time.sleep(0.002)
        s.close()

    def max_between(self, start, end):
        during = [d for t0, d in self.latencies if start <= t0 <= end]
        return max(during), len(during)


def test_16mib_body_routed_by_model_does_not_stall_other_requests(thaw_factory, sims):
    big, small = sims("big"), sims("small")
    t = thaw_factory({"models": [
        {"name": "big", "endpoints": [big.address], "max_concurrency": 4},
        {"name": "small", "endpoints": [small.address], "max_concurrency": 4}]})
    body = token_ids_body("big", 16 * 1024 * 1024 - 4096)
    assert len(body) <= 16 * 1024 * 1024
    # Warm up both paths, then take the baseline.
    assert httpc.request(t.host, t.port, "GET", "/health", {"Host": "small"}).status == 200
    warm = httpc.request(t.host, t.port, "POST", "/v1/chat/completions",
                         {"Content-Type": "application/json"},
                         json.dumps({"model": "big", "messages": []}).encode())
    assert warm.status == 200, warm.body
    time.sleep(0.2)
    baseline = rss_kib(t.proc.pid)

    client = SmallRequests(t, "small")
    client.start()
    wait_for(lambda: len(client.latencies) >= 20, what="small requests flowing")
    start = time.perf_counter()
    s = t.connect(timeout=60)
    httpc.send(s, "POST", "/v1/chat/completions", {"Content-Type": "application/json"}, body)
    r = httpc.Reader(s).response()
    end = time.perf_counter()
    s.close()
    time.sleep(0.1)
    client.stop.set()
    client.join(10)
    assert r.status == 200, r.body[:300]
    assert r.json()["model"] == "big"
    worst, n = client.max_between(start, end)
    # The body's memory goes back to the system once the request is done
    # (sanitized builds keep freed memory in quarantine: not measured).
    deadline = time.monotonic() + 3
    after = rss_kib(t.proc.pid)
    while after - baseline > 24 * 1024 and time.monotonic() < deadline:
        time.sleep(0.1)
        after = rss_kib(t.proc.pid)
    print(f"16 MiB body: {end - start:.3f} s; {n} small requests meanwhile, "
          f"max {worst * 1000:.1f} ms; RSS baseline {baseline} KiB, after {after} KiB")
    assert n >= 5
    # Before the streaming scan, the whole body was parsed into a tree on
    # the loop: every request waited seconds, and the tree's memory stayed.
    # (0.5 s leaves room for a machine busy with other work.)
    assert worst < 0.5 * SLOW, f"a small request took {worst * 1000:.0f} ms"
    if not os.environ.get("THAW_SANITIZED"):
        assert after - baseline < 24 * 1024, f"RSS {baseline} KiB -> {after} KiB"
    assert t.metric("thaw_buffered_body_bytes") == 0
    t.assert_reconciled()


def test_model_known_early_answers_before_the_body_ends(thaw_factory, sims):
    sim = sims("llama")
    t = thaw_factory({"models": [{"name": "llama", "endpoints": [sim.address]}]})
    s = t.connect(timeout=10)
    # An unknown model is answered as soon as its name is read, without
    # waiting for the (declared 8 MiB) rest of the body.
    head = ("POST /v1/completions HTTP/1.1\r\nHost: thaw.test\r\n"
            "Content-Type: application/json\r\nContent-Length: 8388608\r\n\r\n")
    s.sendall(head.encode() + b'{"model":"nope","prompt":"')
    s.settimeout(5 * SLOW)
    r = httpc.Reader(s).response()
    s.close()
    assert r.status == 404
    assert r.json()["error"]["code"] == "model_not_found"
    assert r.header("connection") == "close"
    t.assert_reconciled()


@pytest.mark.parametrize("body,status,kind,detail", [
    (b'{"messages":[{"role":"user"}', 400, "bad_json", "the body ends before the JSON does"),
    (b'{"model" "llama"}', 400, "bad_json", "expected ':' after a key at byte 9"),
    (b'[{"model":"llama"}]', 400, "bad_json", "the body is not a JSON object at byte 0"),
    (b'{"messages":[{"model":"llama"}],"input":{"model":"llama"}}', 400, "missing_model", None),
    (b'{"model":42}', 400, "missing_model", None),
    (b'{"mo\\u0064el":"ll\\u0061ma","prompt":"hi"}', 200, None, None),
    (b'{"a":{"model":"nope"},"model":"llama"}', 200, None, None),
    # The whole body is read: a second "model" (the one Python's json keeps)
    # and a malformed rest are refused, not passed on behind a route.
    (b'{"model":"llama","prompt":"hi","model":"nope"}', 400, "duplicate_model", None),
    (b'{"model":7,"model":"llama"}', 400, "duplicate_model", None),
    (b'{"model":"llama","prompt":"hi"} trailing', 400, "bad_json",
     "unexpected data after the JSON object at byte 32"),
    (b'{"model":"llama","n":[1,2', 400, "bad_json", "the body ends before the JSON does"),
    # JSON is UTF-8 (RFC 8259 8.1).
    (b'{"model":"llama","x":"\xff\xfe"}', 400, "bad_json", "invalid UTF-8 in a string at byte 22"),
    (b'{"model":"llama","x":"caf\xc3\xa9 \xf0\x9f\x98\x80"}', 200, None, None),
])
def test_body_routing_answers(thaw_factory, sims, body, status, kind, detail):
    sim = sims("llama")
    t = thaw_factory({"models": [{"name": "llama", "endpoints": [sim.address]}]})
    r = httpc.request(t.host, t.port, "POST", "/v1/completions",
                      {"Content-Type": "application/json"}, body)
    assert r.status == status, r.body
    if kind:
        err = r.json()["error"]
        assert err["code"] == kind and r.status == status
        if detail:
            assert detail in err["message"]


def test_a_body_refused_once_read_whole_keeps_the_connection(thaw_factory, sims):
    """Refused when its end shows it is not JSON, a request has been read
    whole: the connection goes on to the next request (one refused before its
    body is in closes, as the rest of the body would be out of step)."""
    sim = sims("llama")
    t = thaw_factory({"models": [{"name": "llama", "endpoints": [sim.address]}]})
    s = t.connect()
    rd = httpc.Reader(s)
    refused = [
        ("/v1/completions", "application/json", b'{"model":"llama","prompt":"hi"', "bad_json"),
        # Found bad at its last byte, still in the read that completes it.
        ("/v1/completions", "application/json", b'{"model":"llama"}]', "bad_json"),
        ("/v1/completions", "application/json", b'{"model":"nope"}', "model_not_found"),
        ("/v1/audio/transcriptions", "multipart/form-data; boundary=XX",
         b'--XX\r\nContent-Disposition: form-data; name="file"\r\n\r\nRIFF\r\n--XX--',
         "missing_model"),
    ]
    for path, ctype, body, code in refused:
        httpc.send(s, "POST", path, {"Content-Type": ctype}, body)
        r = rd.response()
        assert r.status in (400, 404) and r.json()["error"]["code"] == code, r.body
        assert r.header("connection") != "close", body
    httpc.send(s, "POST", "/v1/completions", {"Content-Type": "application/json"},
               b'{"model":"llama","prompt":"hi"}')
    assert rd.response().status == 200
    s.close()
    t.assert_reconciled()


def test_a_head_refused_with_its_body_beside_it_keeps_the_connection(thaw_factory, sims):
    """A request refused at its head (a model nobody serves in the path, a
    compressed body, a bad priority) whose short body came in the same
    packet is read to its end, answered, and the connection goes on; one
    whose body is still to come closes, as the rest would be out of step."""
    sim = sims("llama")
    t = thaw_factory({"models": [{"name": "llama", "endpoints": [sim.address]}]})
    s = t.connect()
    rd = httpc.Reader(s)
    body = b'{"model":"llama","prompt":"hi"}'
    refused = [
        ("/models/nope/v1/completions", {}, 404, "model_not_found"),
        ("/v1/completions", {"Content-Encoding": "gzip"}, 415, "encoded_body"),
        ("/v1/completions", {"thaw-priority": "urgent"}, 400, "bad_priority"),
    ]
    for path, headers, status, code in refused:
        httpc.send(s, "POST", path, {"Content-Type": "application/json", **headers}, body)
        r = rd.response()
        assert r.status == status and r.json()["error"]["code"] == code, r.body
        assert r.header("connection") != "close", path
    # Pipelined behind a refused one, the next request is served.
    httpc.send(s, "POST", "/models/nope/v1/completions", {}, body)
    httpc.send(s, "POST", "/v1/completions", {"Content-Type": "application/json"}, body)
    assert rd.response().status == 404 and rd.response().status == 200
    s.close()
    # CONNECT takes no body, whatever its Content-Length says: what follows
    # it is not read as one, nor as a request of its own. Refused and closed.
    inner = (b"POST /v1/completions HTTP/1.1\r\nHost: thaw.test\r\nContent-Type: "
             b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    s = t.connect()
    s.sendall(b"CONNECT thaw.test:80 HTTP/1.1\r\nHost: thaw.test\r\nContent-Length: %d\r\n"
              b"\r\n%s" % (len(inner), inner))
    r = httpc.Reader(s).response()
    assert r.status == 405 and r.header("connection") == "close"
    assert httpc.closed_by_peer(s)
    s.close()
    assert t.metric("thaw_requests_total", model="llama", code="200") == 1
    # The body not in yet: answered at once, and closed.
    s = t.connect()
    s.sendall(b"POST /models/nope/v1/completions HTTP/1.1\r\nHost: thaw.test\r\n"
              b"Content-Length: 100\r\n\r\n")
    r = httpc.Reader(s).response()
    assert r.status == 404 and r.header("connection") == "close"
    s.close()
    t.assert_reconciled()


def test_model_split_across_chunks_and_reads(thaw_factory, sims):
    sim = sims("llama")
    t = thaw_factory({"models": [{"name": "llama", "endpoints": [sim.address]}]})
    body = b'{"messages":[{"role":"user","content":"say \\"model\\""}],"mo\\u0064el":"llama"}'
    for cut in range(1, len(body)):
        s = t.connect()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: thaw.test\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        for piece in (body[:cut], body[cut:]):
            s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            time.sleep(0.001)
        s.sendall(b"0\r\n\r\n")
        r = httpc.Reader(s).response()
        s.close()
        assert r.status == 200, (cut, r.body)
    t.assert_reconciled()


def sim_model(name, load_ms):
    return {"name": name,
            "command": [SIM, "--port", "{port}", "--model", name, "--load-ms", str(load_ms),
                        "--token-ms", "0", "--tokens", "1"],
            "idle_timeout_ms": 60000, "startup_timeout_ms": 20000 * SLOW, "stop_grace_ms": 2000}


def send_held(t, body, chunked=False):
    """Starts a request for the cold model; returns its socket."""
    s = t.connect(timeout=30)
    if chunked:
        head = ("POST /v1/completions HTTP/1.1\r\nHost: thaw.test\r\n"
                "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        half = len(body) // 2
        s.sendall(head.encode() + b"%x\r\n%s\r\n" % (half, body[:half])
                  + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body) - half, body[half:]))
    else:
        httpc.send(s, "POST", "/v1/completions", {"Content-Type": "application/json"}, body)
    return s


def test_held_bodies_over_the_buffer_budget_get_503(thaw_factory):
    budget = 1024 * 1024
    t = thaw_factory({"limits": {"max_buffered_body_bytes": budget},
                      "models": [sim_model("llama", 1500 * SLOW)]})
    body = json.dumps({"model": "llama", "prompt": "x" * (400 * 1024)}).encode()
    held = [send_held(t, body), send_held(t, body)]
    wait_for(lambda: t.metric("thaw_queue_depth", model="llama", tier="standard") == 2,
             what="two requests held")
    assert t.metric("thaw_buffered_body_bytes") == 2 * len(body)

    # A third (declared length) would take the held bodies over the budget.
    third = send_held(t, body)
    r = httpc.Reader(third).response()
    third.close()
    assert r.status == 503, r.body
    err = r.json()["error"]
    assert err["code"] == "body_buffer_full" and err["type"] == "server_error"
    assert "max_buffered_body_bytes" in err["message"]
    assert int(r.header("retry-after")) >= 1
    assert r.header("connection") == "close"

    # A chunked body is counted as it arrives.
    fourth = send_held(t, body, chunked=True)
    r = httpc.Reader(fourth).response()
    fourth.close()
    assert r.status == 503 and r.json()["error"]["code"] == "body_buffer_full"
    assert t.metric("thaw_rejections_total", reason="body_buffer_full") == 2

    # A body larger than the whole budget could never be held: 413.
    huge = httpc.request(t.host, t.port, "POST", "/v1/completions",
                         {"Content-Type": "application/json"}, b" " * (budget + 1))
    assert huge.status == 413 and huge.json()["error"]["code"] == "body_too_large"

    # The held ones are served when the model is up; the budget empties.
    for s in held:
        s.settimeout(30 * SLOW)
        r = httpc.Reader(s).response()
        assert r.status == 200, (r.body, t.logs()[-3000:])
        s.close()
    wait_for(lambda: t.metric("thaw_buffered_body_bytes") == 0, what="budget released")
    ok = send_held(t, body)
    assert httpc.Reader(ok).response().status == 200
    ok.close()
    t.assert_reconciled()
