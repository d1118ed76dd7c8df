"""End-to-end: the OpenAI-compatible front door. /v1/models answered by thaw
itself, routing by the body's model on every OpenAI endpoint (JSON and
multipart uploads), thaw's errors in OpenAI's shape, errors inside a loading
event stream, and the official openai npm client against all of it."""

import io
import json
import socket
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import wave

import pytest

import httpc
from conftest import ROOT, free_port, wait_for
from openai_replica import Replica
from test_proxy import raw_exchange

SIM = os.environ.get("THAW_SIM_BIN", os.path.join(ROOT, "build", "thaw-model-sim"))
SLOW = 3 if os.environ.get("THAW_SANITIZED") else 1
HERE = os.path.dirname(os.path.abspath(__file__))
REPLICA = os.path.join(HERE, "openai_replica.py")
CLIENT_DIR = os.path.join(ROOT, "tests", "openai")

JSON_PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
              "/v1/moderations", "/v1/images/generations", "/v1/audio/speech", "/rerank",
              "/v1/rerank", "/v2/rerank", "/score", "/v1/score", "/tokenize", "/detokenize"]
FORM_PATHS = ["/v1/audio/transcriptions", "/v1/audio/translations", "/v1/images/edits"]


@pytest.fixture
def replica():
    r = Replica().start()
    yield r
    r.stop()


@pytest.fixture
def replica2():
    r = Replica().start()
    yield r
    r.stop()


def cold_model(name="sleepy"):
    """A process model that is never meant to start in these tests."""
    return {"name": name, "command": [SIM, "--port", "{port}", "--model", name,
                                      "--load-ms", "200"],
            "idle_timeout_ms": 60000, "startup_timeout_ms": 20000 * SLOW}


def model_status(t, name):
    return next(m for m in t.status()["models"] if m["name"] == name)


def wav_bytes(seconds=0.1, rate=8000):
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\x00\x10" * int(seconds * rate))
    return out.getvalue()


def form(fields, boundary="----thawFormBoundary7MA4YWxk"):
    """A multipart/form-data body: fields is [(name, filename or None, bytes)]."""
    parts = []
    for name, filename, data in fields:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        head = f"Content-Disposition: {disp}\r\n"
        if filename:
            head += "Content-Type: application/octet-stream\r\n"
        parts.append(f"--{boundary}\r\n{head}\r\n".encode() + data + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def assert_openai_error(err, code, status_type):
    assert set(err) >= {"message", "type", "param", "code"}, err
    assert err["code"] == code and err["type"] == status_type, err


# --- /v1/models ---------------------------------------------------------------


def test_a_static_endpoint_that_refuses_is_not_listed_ready(thaw_factory, replica):
    with socket.socket() as s:  # a port that refuses: bound, never listening
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
        t = thaw_factory({"upstream": {"eject_ms": 60000}, "models": [
            {"name": "down", "endpoints": [dead]},
            {"name": "half", "endpoints": [dead, replica.address]}]})

        def listed():
            r = httpc.request(t.host, t.port, "GET", "/v1/models")
            return {m["id"]: (m["state"], m["replicas"]) for m in r.json()["data"]}

        assert listed() == {"down": ("ready", 1), "half": ("ready", 2)}  # nothing known yet
        r = httpc.request(t.host, t.port, "POST", "/v1/completions", {}, b'{"model":"down"}')
        assert r.status == 502, r.body
        for _ in range(4):  # until the dead one of "half" has been tried
            r = httpc.request(t.host, t.port, "POST", "/v1/completions", {}, b'{"model":"half"}')
            assert r.status == 200, r.body
        assert listed() == {"down": ("unavailable", 0), "half": ("ready", 1)}


def test_models_listed_by_thaw_without_waking_anything(thaw_factory, replica):
    t = thaw_factory({"models": [
        {"name": "gpt-test", "endpoints": [replica.address], "hosts": ["gpt.example"],
         "aliases": ["org/gpt-test-large", "whisper-1"]},
        cold_model("sleepy")]})
    for host in ("thaw.test", "gpt.example", "sleepy"):
        r = httpc.request(t.host, t.port, "GET", "/v1/models", {"Host": host})
        assert r.status == 200 and r.header("content-type") == "application/json", r.body
        listing = r.json()
        assert listing["object"] == "list"
        ids = [m["id"] for m in listing["data"]]
        assert ids == sorted(["gpt-test", "org/gpt-test-large", "whisper-1", "sleepy"])
        for m in listing["data"]:
            assert m["object"] == "model" and isinstance(m["created"], int)
            assert m["owned_by"] == "default"  # the model's namespace
        by_id = {m["id"]: m for m in listing["data"]}
        assert by_id["whisper-1"]["root"] == "gpt-test"
        assert by_id["gpt-test"]["state"] == "ready"
        assert by_id["sleepy"]["state"] == "scaled_to_zero"
    # One model, by name or alias (a slash percent-encoded or not); HEAD too.
    for path in ("/v1/models/gpt-test", "/v1/models/org%2Fgpt-test-large",
                 "/v1/models/org/gpt-test-large", "/v1/models/sleepy?x=1",
                 "/models/gpt-test/v1/models/whisper-1"):
        r = httpc.request(t.host, t.port, "GET", path)
        assert r.status == 200, (path, r.body)
        assert r.json()["object"] == "model"
    assert httpc.request(t.host, t.port, "GET", "/v1/models/org%2Fgpt-test-large").json()[
        "id"] == "org/gpt-test-large"
    r = httpc.request(t.host, t.port, "HEAD", "/v1/models")
    assert r.status == 200 and r.body == b""
    # An unknown id: 404 in OpenAI's shape, naming the model.
    r = httpc.request(t.host, t.port, "GET", "/v1/models/gpt-nope", {"Host": "gpt.example"})
    assert r.status == 404
    err = r.json()["error"]
    assert_openai_error(err, "model_not_found", "invalid_request_error")
    assert err["param"] == "model" and "`gpt-nope`" in err["message"]
    # Nothing reached the replica, and the process model never started.
    assert replica.counts == {}
    st = model_status(t, "sleepy")
    assert st["processes"] == [] and st["state"] == "scaled_to_zero"
    assert t.metric("thaw_requests_proxied_total") == 10
    # Answered by thaw, for no model: counted where such answers are, by code.
    assert t.metric("thaw_unrouted_responses_total", code="200") == 10
    assert t.metric("thaw_unrouted_responses_total", code="404") == 1
    t.assert_reconciled()


# --- routing by the body --------------------------------------------------------


def test_every_openai_endpoint_routes_by_its_body(thaw_factory, replica, replica2):
    t = thaw_factory({"models": [
        {"name": "a", "endpoints": [replica.address]},
        {"name": "b", "endpoints": [replica2.address], "aliases": ["whisper-1"]}]})
    for path in JSON_PATHS:
        r = httpc.request(t.host, t.port, "POST", path, {"Content-Type": "application/json"},
                          json.dumps({"input": "x", "model": "b"}).encode())
        assert r.status == 200, (path, r.body)
        assert replica2.counts.get("POST " + path) == 1, path
    for path in FORM_PATHS:
        body, ctype = form([("file", "a.wav", wav_bytes()), ("language", None, b"en"),
                            ("model", None, b"whisper-1")])
        r = httpc.request(t.host, t.port, "POST", path, {"Content-Type": ctype}, body)
        assert r.status == 200, (path, r.body)
        assert r.json()["model"] == "whisper-1" and replica2.counts.get("POST " + path) == 1
    assert replica.counts == {}
    t.assert_reconciled()


def test_curl_uploads_route_by_their_model_field_whatever_the_file_is_called(
        thaw_factory, replica):
    """curl sends a file's name as it is, a Windows path's backslashes and
    UTF-8 too: the form still routes, and the replica gets it whole."""
    t = thaw_factory({"models": [{"name": "w", "endpoints": [replica.address],
                                  "aliases": ["whisper-1"]}]})
    d = tempfile.mkdtemp(prefix="thaw-upload-")
    wav = os.path.join(d, "speech.wav")
    audio = wav_bytes()
    with open(wav, "wb") as f:
        f.write(audio)
    for filename in ("C:\\Users\\me\\speech.wav", "back\\slash.wav", "caf\u00e9 \u00e0.wav"):
        p = subprocess.run(["curl", "-sS", "-o", "-", "-w", "\n%{http_code}",
                            "-F", f"file=@{wav};filename={filename}", "-F", "model=whisper-1",
                            f"{t.url}/v1/audio/transcriptions"],
                           capture_output=True, timeout=60)
        body, _, code = p.stdout.rpartition(b"\n")
        assert p.returncode == 0 and code == b"200", (filename, p.stderr, p.stdout)
        assert json.loads(body)["text"] == f"{len(audio)} bytes for whisper-1", body
    assert replica.counts == {"POST /v1/audio/transcriptions": 3}
    t.assert_reconciled()


def test_multipart_errors_are_openai_errors(thaw_factory, replica):
    t = thaw_factory({"models": [{"name": "whisper", "endpoints": [replica.address]}]})
    path = "/v1/audio/transcriptions"
    # No boundary: refused at the head.
    r = httpc.request(t.host, t.port, "POST", path, {"Content-Type": "application/json"},
                      b'{"model":"whisper"}')
    assert r.status == 400
    assert_openai_error(r.json()["error"], "bad_form", "invalid_request_error")
    # A form without a model field.
    body, ctype = form([("file", "a.wav", b"RIFF....")])
    r = httpc.request(t.host, t.port, "POST", path, {"Content-Type": ctype}, body)
    assert r.status == 400
    err = r.json()["error"]
    assert_openai_error(err, "missing_model", "invalid_request_error")
    assert err["param"] == "model"
    # A model nobody serves: named in the message.
    body, ctype = form([("model", None, b"whisper-9"), ("file", "a.wav", b"RIFF")])
    r = httpc.request(t.host, t.port, "POST", path, {"Content-Type": ctype}, body)
    assert r.status == 404
    err = r.json()["error"]
    assert_openai_error(err, "model_not_found", "invalid_request_error")
    assert "`whisper-9`" in err["message"] and err["param"] == "model"
    # Not a form at all.
    r = httpc.request(t.host, t.port, "POST", path,
                      {"Content-Type": "multipart/form-data; boundary=xyz"}, b"garbage")
    assert r.status == 400 and r.json()["error"]["code"] == "bad_form"
    assert "at byte" in r.json()["error"]["message"]
    assert replica.counts == {}
    t.assert_reconciled()


def test_a_body_naming_the_model_twice_is_refused(thaw_factory, replica, replica2):
    """Routed by the first "model" and run by the server as the last, such a
    body would be counted and capped as one model and served as another:
    thaw reads the whole body and refuses it, in JSON and in forms, also
    when the second comes well after the first routed the request."""
    t = thaw_factory({"models": [{"name": "a", "endpoints": [replica.address]},
                                 {"name": "b", "endpoints": [replica2.address]},
                                 cold_model("sleepy")]})
    r = httpc.request(t.host, t.port, "POST", "/v1/embeddings",
                      {"Content-Type": "application/json"},
                      b'{"model":"a","input":"x","model":"b"}')
    assert r.status == 400, r.body
    err = r.json()["error"]
    assert_openai_error(err, "duplicate_model", "invalid_request_error")
    assert err["param"] == "model" and "(model `a`)" in err["message"], err
    body, ctype = form([("model", None, b"a"), ("file", "a.wav", wav_bytes()),
                        ("model", None, b"b")])
    r = httpc.request(t.host, t.port, "POST", "/v1/audio/transcriptions",
                      {"Content-Type": ctype}, body)
    assert r.status == 400 and r.json()["error"]["code"] == "duplicate_model", r.body
    # A part's name that parsers read differently (python-multipart keeps the
    # last name parameter and the last boundary, others the first): refused.
    b = "----thawFormBoundary7MA4YWxk"
    sneaky = (f"--{b}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\na\r\n"
              f"--{b}\r\nContent-Disposition: form-data; name=\"x\"; name=\"model\"\r\n\r\nb\r\n"
              f"--{b}--\r\n").encode()
    r = httpc.request(t.host, t.port, "POST", "/v1/audio/transcriptions",
                      {"Content-Type": f"multipart/form-data; boundary={b}"}, sneaky)
    assert r.status == 400 and r.json()["error"]["code"] == "bad_form", r.body
    assert "ambiguous name parameter" in r.json()["error"]["message"]
    body, _ = form([("model", None, b"a")], boundary="BBBB")
    r = httpc.request(t.host, t.port, "POST", "/v1/audio/transcriptions",
                      {"Content-Type": "multipart/form-data; boundary=AAAA; boundary=BBBB"}, body)
    assert r.status == 400 and r.json()["error"]["code"] == "bad_form", r.body
    # A lone surrogate escape is valid JSON grammar that Python's json takes
    # (JavaScript writes one for a string cut inside an emoji): passed on.
    r = httpc.request(t.host, t.port, "POST", "/v1/embeddings",
                      {"Content-Type": "application/json"}, b'{"model":"a","input":"x\\ud83d"}')
    assert r.status == 200 and replica.counts.pop("POST /v1/embeddings") == 1, r.body
    # A compressed body names no model thaw can read: said so, not bad_json.
    r = httpc.request(t.host, t.port, "POST", "/v1/embeddings",
                      {"Content-Type": "application/json", "Content-Encoding": "gzip"},
                      b"\x1f\x8b\x08\x00")
    assert r.status == 415, r.body
    assert_openai_error(r.json()["error"], "encoded_body", "invalid_request_error")
    r = raw_exchange(t, b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
                        b"Content-Encoding: identity\r\nContent-Encoding: gzip\r\n\r\n\x1f\x8b\x08\x00")
    assert r.status == 415, r.body
    # The second arrives in a later read, after the first routed the
    # request to a cold model: still refused, and nothing reaches a replica.
    s = t.connect()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: thaw.test\r\n"
              b"Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n")
    first = b'{"model":"sleepy","messages":[{"role":"user","content":"hi"}],'
    s.sendall(b"%x\r\n%s\r\n" % (len(first), first))
    time.sleep(0.2)
    second = b'"model":"a"}'
    s.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(second), second))
    s.settimeout(10 * SLOW)
    r = httpc.Reader(s).response()
    s.close()
    assert r.status == 400 and r.json()["error"]["code"] == "duplicate_model", r.body
    assert replica.counts == {} and replica2.counts == {}
    t.assert_reconciled()


class ModelsPoller(threading.Thread):
    """GET /v1/models (answered by thaw's loop itself) back to back on one
    keep-alive connection, timed."""

    def __init__(self, t):
        super().__init__(daemon=True)
        self.t = t
        self.stop = threading.Event()
        self.latencies = []

    def run(self):
        s = self.t.connect()
        rd = httpc.Reader(s)
        while not self.stop.is_set():
            t0 = time.perf_counter()
            httpc.send(s, "GET", "/v1/models")
            r = rd.response()
            assert r.status == 200
            self.latencies.append((t0, time.perf_counter() - t0))
            time.sleep(0.002)
        s.close()

    def during(self, start, end):
        return sorted(d for t0, d in self.latencies if start <= t0 <= end)


@pytest.fixture
def replica_process():
    port = free_port()
    proc = subprocess.Popen([sys.executable, REPLICA, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up():
        try:
            return httpc.request("127.0.0.1", port, "GET", "/health", timeout=1).status == 200
        except OSError:
            return False
    wait_for(up, what="replica process")
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


def test_large_json_and_multipart_bodies_route_without_stalling_the_loop(
        thaw_factory, replica_process):
    t = thaw_factory({"models": [{"name": "big", "endpoints": [replica_process],
                                  "aliases": ["whisper-big"]}]})
    tail = json.dumps({"model": "big"})[1:]
    n = (16 * 1024 * 1024 - 4096 - len(tail)) // 2
    big_json = b'{"input":[' + b"7," * n + b"7]," + tail.encode()
    audio = os.urandom(1024 * 1024)
    upload, ctype = form([("file", "speech.wav", audio), ("model", None, b"whisper-big")])
    poller = ModelsPoller(t)
    poller.start()
    wait_for(lambda: len(poller.latencies) >= 20, what="listing requests flowing")
    figures = []
    # The upload is quick: sent a few times over, for enough listings meanwhile.
    for path, headers, body, model, times in (
            ("/v1/embeddings", {"Content-Type": "application/json"}, big_json, "big", 1),
            ("/v1/audio/transcriptions", {"Content-Type": ctype}, upload, "whisper-big", 8)):
        start = time.perf_counter()
        for _ in range(times):
            r = httpc.request(t.host, t.port, "POST", path, headers, body, timeout=60)
            assert r.status == 200, r.body[:300]
            assert r.json()["model"] == model
        end = time.perf_counter()
        time.sleep(0.05)
        lat = poller.during(start, end)
        assert len(lat) >= 3, f"only {len(lat)} listings during {path}"
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        figures.append((path, len(body), (end - start) / times, len(lat), p99, lat[-1]))
    poller.stop.set()
    poller.join(10)
    for path, size, took, n_lat, p99, worst in figures:
        print(f"{path}: {size} bytes routed in {took * 1000:.0f} ms each; {n_lat} listings "
              f"meanwhile, p99 {p99 * 1000:.1f} ms, max {worst * 1000:.1f} ms")
        assert p99 < 0.2 * SLOW, f"{path}: p99 {p99 * 1000:.0f} ms"
    t.assert_reconciled()


# --- errors inside a loading event stream -----------------------------------------


def stream_events(t, model):
    r = httpc.request(t.host, t.port, "POST", "/v1/chat/completions",
                      {"Content-Type": "application/json"},
                      json.dumps({"model": model, "stream": True, "messages": []}).encode(),
                      timeout=60)
    return r, [e for e in r.body.decode().split("\n\n") if e]


def test_replica_error_after_heartbeats_ends_as_an_sse_error_event(thaw_factory):
    t = thaw_factory({"models": [{
        "name": "flaky", "loading_heartbeat_ms": 100, "idle_timeout_ms": 60000,
        "startup_timeout_ms": 20000 * SLOW,
        "command": [sys.executable, REPLICA, "--port", "{port}", "--load-ms", "500",
                    "--error-status", "503"]}]})
    r, events = stream_events(t, "flaky")
    assert r.status == 200 and r.header("content-type") == "text/event-stream"
    assert events[0].startswith(": loading ") and len(events) >= 3, events
    # Heartbeats, then exactly one error event: never the replica's raw JSON.
    assert all(e.startswith(": loading ") for e in events[:-1]), events
    assert events[-1].startswith("event: error\ndata: {"), events[-1]
    err = json.loads(events[-1][len("event: error\ndata: "):])["error"]
    assert err["status"] == 503
    assert err["message"] == "the replica cannot serve this now (model `flaky`)"
    assert err["type"] == "replica_error" and err["code"] == "replica_busy"
    assert "param" in err
    # Warm now: the replica's own error answer passes through untouched.
    r, _ = stream_events(t, "flaky")
    assert r.status == 503 and r.json()["error"]["code"] == "replica_busy"
    t.assert_reconciled()


def test_a_vllm_error_after_heartbeats_keeps_its_message_and_code(thaw_factory):
    """vLLM answers {"object": "error", "message", "type", "code": 503}: the
    event carries its message, and its numeric code as a string."""
    t = thaw_factory({"models": [{
        "name": "flaky", "loading_heartbeat_ms": 100, "idle_timeout_ms": 60000,
        "startup_timeout_ms": 20000 * SLOW,
        "command": [sys.executable, REPLICA, "--port", "{port}", "--load-ms", "300",
                    "--error-status", "503", "--vllm-error"]}]})
    r, events = stream_events(t, "flaky")
    assert r.status == 200 and events[-1].startswith("event: error\ndata: {"), events
    err = json.loads(events[-1][len("event: error\ndata: "):])["error"]
    assert err["status"] == 503 and err["code"] == "503", err
    assert err["message"] == "the replica cannot serve this now (model `flaky`)"
    assert err["type"] == "ServiceUnavailableError"
    t.assert_reconciled()


def test_a_held_stream_asks_for_no_content_coding(thaw_factory):
    """thaw's event-stream head goes out uncoded before the replica answers:
    the replica, which gzips for a client that accepts it, is asked for
    identity, and its tokens arrive readable."""
    t = thaw_factory({"models": [{
        "name": "gz", "loading_heartbeat_ms": 100, "idle_timeout_ms": 60000,
        "startup_timeout_ms": 20000 * SLOW,
        "command": [sys.executable, REPLICA, "--port", "{port}", "--load-ms", "400",
                    "--gzip"]}]})
    r = httpc.request(t.host, t.port, "POST", "/v1/chat/completions",
                      {"Content-Type": "application/json", "Accept-Encoding": "gzip, deflate"},
                      json.dumps({"model": "gz", "stream": True, "messages": []}).encode(),
                      timeout=60)
    assert r.status == 200 and r.header("content-encoding") is None
    assert b": loading" in r.body and r.body.rstrip().endswith(b"data: [DONE]"), r.body[-200:]
    assert b'"content": "one "' in r.body


def test_a_held_stream_answered_without_an_event_stream_ends_with_an_error_event(thaw_factory):
    """A server that answers "stream": true with one JSON object (it does not
    stream) cannot continue thaw's event stream: the client gets an error
    event saying so, not a JSON object inside an event stream."""
    t = thaw_factory({"models": [{
        "name": "flat", "loading_heartbeat_ms": 100, "idle_timeout_ms": 60000,
        "startup_timeout_ms": 20000 * SLOW,
        "command": [sys.executable, REPLICA, "--port", "{port}", "--load-ms", "400",
                    "--no-stream"]}]})
    r, events = stream_events(t, "flat")
    assert r.status == 200 and events[-1].startswith("event: error\ndata: {"), events
    err = json.loads(events[-1][len("event: error\ndata: "):])["error"]
    assert err["status"] == 502 and err["code"] == "upstream_error", err
    assert "other than an event stream" in err["message"] and "`flat`" in err["message"]
    assert not any('"chat.completion"' in e for e in events)
    assert t.metric("thaw_requests_total", model="flat", code="502") == 1  # counted as sent
    t.assert_reconciled()


@pytest.mark.parametrize("extra,stream,heartbeats", [
    ({"image": "x" * (2 << 20)}, True, True),   # a chat with an image: over 1 MiB
    ({}, [True, False], False),                  # the server reads the last "stream"
    ({}, [False, True], True),
])
def test_heartbeats_follow_the_stream_the_server_will_read(thaw_factory, extra, stream,
                                                           heartbeats):
    t = thaw_factory({"models": [{
        "name": "m", "loading_heartbeat_ms": 100, "idle_timeout_ms": 60000,
        "startup_timeout_ms": 20000 * SLOW,
        "command": [sys.executable, REPLICA, "--port", "{port}", "--load-ms", "500"]}]})
    keys = stream if isinstance(stream, list) else [stream]
    body = "{" + ", ".join(f'"stream": {json.dumps(v)}' for v in keys)
    body += ', "model": "m", "messages": []'
    body += "".join(f', "{k}": {json.dumps(v)}' for k, v in extra.items()) + "}"
    r = httpc.request(t.host, t.port, "POST", "/v1/chat/completions",
                      {"Content-Type": "application/json"}, body.encode(), timeout=60)
    assert r.status == 200
    assert (b": loading" in r.body) == heartbeats, r.body[:300]
    if heartbeats:
        assert r.header("content-type") == "text/event-stream"
        assert r.body.rstrip().endswith(b"data: [DONE]")
    else:
        assert r.header("content-type") == "application/json"
        assert json.loads(r.body)["object"] == "chat.completion"


def test_a_request_routed_by_path_does_not_inherit_an_earlier_requests_stream(thaw_factory,
                                                                              replica):
    """A streaming request routed by its body, then (reusing thaw's request
    object) one routed by path with no "stream" to a cold model: the second
    is no stream, so it gets the server's JSON, not heartbeats."""
    t = thaw_factory({"models": [
        {"name": "warm", "endpoints": [replica.address]},
        {"name": "cold", "loading_heartbeat_ms": 100, "idle_timeout_ms": 60000,
         "startup_timeout_ms": 20000 * SLOW,
         "command": [sys.executable, REPLICA, "--port", "{port}", "--load-ms", "400"]}]})
    r = httpc.request(t.host, t.port, "POST", "/v1/chat/completions",
                      {"Content-Type": "application/json"},
                      b'{"model": "warm", "stream": true, "messages": []}', timeout=30)
    assert r.status == 200 and r.header("content-type") == "text/event-stream"
    r = httpc.request(t.host, t.port, "POST", "/models/cold/v1/chat/completions",
                      {"Content-Type": "application/json"}, b'{"messages": []}', timeout=60)
    assert r.status == 200 and r.header("content-type") == "application/json", r.body[:200]
    assert b": loading" not in r.body


def test_first_byte_timeout_after_heartbeats_is_an_sse_error_event(thaw_factory):
    t = thaw_factory({"models": [{
        "name": "slow", "loading_heartbeat_ms": 100, "idle_timeout_ms": 60000,
        "first_byte_timeout_ms": 300, "startup_timeout_ms": 20000 * SLOW,
        "command": [sys.executable, REPLICA, "--port", "{port}", "--load-ms", "400",
                    "--delay-ms", "3000"]}]})
    r, events = stream_events(t, "slow")
    assert r.status == 200
    assert events[-1].startswith("event: error\ndata: {"), events
    err = json.loads(events[-1][len("event: error\ndata: "):])["error"]
    assert err["status"] == 504 and err["code"] == "upstream_timeout"
    assert "`slow`" in err["message"]
    t.assert_reconciled()


# --- the official openai client ----------------------------------------------------


@pytest.mark.skipif(not shutil.which("node"), reason="node not installed")
def test_openai_npm_client(thaw_factory, replica):
    if not os.path.isdir(os.path.join(CLIENT_DIR, "node_modules", "openai")):
        pytest.skip("npm packages not installed (scripts/setup.sh test installs them)")
    t = thaw_factory({"models": [
        {"name": "gpt-test", "endpoints": [replica.address], "aliases": ["whisper-1"]},
        cold_model("sleepy")]})
    wav = os.path.join(tempfile.mkdtemp(prefix="thaw-wav-"), "speech.wav")
    audio = wav_bytes()
    with open(wav, "wb") as f:
        f.write(audio)
    p = subprocess.run(["node", "client.mjs", f"{t.url}/v1", wav, "gpt-test", "whisper-1"],
                       cwd=CLIENT_DIR, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    ids = {m["id"]: m for m in out["models"]}
    assert set(ids) == {"gpt-test", "whisper-1", "sleepy"}
    assert ids["sleepy"]["state"] == "scaled_to_zero"
    assert out["retrieved"] == "gpt-test"
    assert out["chat"] == "one two three"
    assert out["responses"] == "answer from gpt-test"
    assert out["embedding"] == [0.5, 0.25, 0.125]
    assert out["transcription"] == f"{len(audio)} bytes for whisper-1"
    for key in ("unknown", "unknownRetrieve"):
        u = out[key]
        assert u["notFound"] is True and u["status"] == 404, u
        assert set(u["error"]) == {"message", "type", "param", "code"}, u
        assert u["error"]["code"] == "model_not_found" and u["error"]["param"] == "model"
        assert "`no-such-model`" in u["error"]["message"]
    # Listing started nothing: the process model has no process.
    st = model_status(t, "sleepy")
    assert st["processes"] == [] and st["state"] == "scaled_to_zero"
    assert "GET /v1/models" not in replica.counts
    t.assert_reconciled()
