"""End-to-end: /metrics with many models is written in pieces, complete and
well-formed, and proxied requests keep flowing while it is written."""

import re
import shutil
import subprocess
import sys
import time

import httpc
from test_large_bodies import SLOW, sims  # noqa: F401 (fixture)

N_MODELS = 400

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"'
                    r'(,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*")*)?\})? '
                    r'(-?[0-9.eE+-]+|\+Inf|-Inf|NaN)$')
HELP = re.compile(r"^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) \S.*$")
TYPE = re.compile(r"^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$")


def many_models(upstream, n=N_MODELS):
    return {"models": [{"name": f"model-{i:03d}", "endpoints": [upstream.address],
                        "max_concurrency": 8} for i in range(n)]}


def family_of(name, types):
    for suffix in ("_bucket", "_sum", "_count"):
        base = name[: -len(suffix)] if name.endswith(suffix) else None
        if base and types.get(base) == "histogram":
            return base
    return name


def check_exposition(text):
    """Every line parses; HELP and TYPE once per family, before its samples;
    a family's samples are together. Returns {family: [sample lines]}."""
    assert text.endswith("\n")
    helps, types, samples = set(), {}, {}
    current = None
    for line in text[:-1].split("\n"):
        m = HELP.match(line)
        if m:
            assert m.group(1) not in helps, f"HELP twice: {line}"
            helps.add(m.group(1))
            current = m.group(1)
            continue
        m = TYPE.match(line)
        if m:
            assert m.group(1) not in types, f"TYPE twice: {line}"
            assert m.group(1) == current, f"TYPE without its HELP: {line}"
            types[m.group(1)] = m.group(2)
            continue
        m = SAMPLE.match(line)
        assert m, f"not a Prometheus sample line: {line!r}"
        fam = family_of(m.group(1), types)
        assert fam == current, f"sample of {fam} outside its family ({current}): {line}"
        samples.setdefault(fam, []).append(line)
    assert helps == set(types)
    return samples


def get_metrics(t, version="1.1"):
    import socket
    s = socket.create_connection(("127.0.0.1", t.admin_port), timeout=30)
    req = (b"GET /metrics HTTP/1.1\r\nHost: admin\r\n\r\n" if version == "1.1"
           else b"GET /metrics HTTP/1.0\r\n\r\n")
    s.sendall(req)
    r = httpc.Reader(s).response()
    s.close()
    return r


def test_metrics_of_400_models_complete_and_well_formed(thaw_factory, upstream):
    t = thaw_factory(many_models(upstream))
    for i in (0, 7, 399):
        r = httpc.request(t.host, t.port, "GET", "/echo", {"Host": f"model-{i:03d}"})
        assert r.status == 200
    r = get_metrics(t)
    assert r.status == 200
    assert r.header("transfer-encoding") == "chunked"
    assert len(r.chunks) > 10, "written in pieces"
    text = r.body.decode()
    samples = check_exposition(text)
    print(f"/metrics: {len(text)} bytes in {len(r.chunks)} chunks")
    for fam in ("thaw_replicas_ready", "thaw_upstream_inflight", "thaw_upstream_errors_total"):
        names = {re.search(r'model="([^"]+)"', line).group(1) for line in samples[fam]}
        assert names == {f"model-{i:03d}" for i in range(N_MODELS)}, fam
    assert len(samples["thaw_queue_depth"]) == 3 * N_MODELS
    assert len(samples["thaw_queue_wait_seconds"]) == 3 * N_MODELS * 20
    assert 'thaw_requests_total{model="model-399",code="200"} 1' in samples["thaw_requests_total"]
    assert "thaw_buffered_body_bytes 0" in samples["thaw_buffered_body_bytes"]
    # The last family is there whole: the answer was not cut short.
    assert text.endswith("\n") and text.split("\n")[-2].startswith("thaw_accept_paused_total")

    # HTTP/1.0: the same exposition, ended by the close.
    r10 = get_metrics(t, "1.0")
    assert r10.status == 200 and r10.header("transfer-encoding") is None
    assert r10.header("connection") == "close"
    assert check_exposition(r10.body.decode()).keys() == samples.keys()

    # HEAD: the same head, no body.
    import socket
    s = socket.create_connection(("127.0.0.1", t.admin_port), timeout=30)
    s.sendall(b"HEAD /metrics HTTP/1.1\r\nHost: admin\r\n\r\n"
              b"GET /metrics HTTP/1.1\r\nHost: admin\r\n\r\n"
              b"GET /healthz HTTP/1.1\r\nHost: admin\r\n\r\n")
    rd = httpc.Reader(s)
    h = rd.response("HEAD")
    assert h.status == 200 and h.header("transfer-encoding") == "chunked"
    # Pipelined after HEAD and after a streamed answer, on one connection.
    assert check_exposition(rd.response().body.decode()).keys() == samples.keys()
    assert rd.response().body == b'{"status":"ok"}\n'
    s.close()

    promtool = shutil.which("promtool")
    if promtool:
        p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=60)
        # promtool lints (e.g. counter names); only parse errors fail.
        assert "error while linting" not in (p.stdout + p.stderr), p.stdout + p.stderr
    t.assert_reconciled()


def test_a_piece_ending_right_after_a_family_header_does_not_repeat_it(thaw_factory, upstream):
    """/metrics goes out in pieces of about 32 KiB. A piece that ended right
    after a family's HELP and TYPE wrote them again at the start of the
    next one: two HELP lines, an exposition Prometheus refuses. Names of
    every length from 1 to 48 move the pieces' ends over every header."""
    from test_reload import hup, write_config
    t = thaw_factory({"models": [{"name": "m", "endpoints": [upstream.address]}]})
    for length in range(1, 49):
        write_config(t, {"models": [{"name": f"m{i}" + "x" * length,
                                     "endpoints": [upstream.address]} for i in range(3)]})
        hup(t)
        r = get_metrics(t)
        assert r.status == 200 and len(r.body) > 32 * 1024  # more than one piece
        try:
            check_exposition(r.body.decode())
        except AssertionError as e:
            raise AssertionError(f"names of {length + 2} bytes: {e}") from None


def test_one_name_in_two_namespaces_gives_two_sets_of_series(thaw_factory, upstream):
    """Two file models named llama, in namespaces team-a and team-b: their
    series carry the namespace (before, both wrote the same series, and
    Prometheus refused the scrape); one in "default" carries none."""
    t = thaw_factory({"models": [
        {"name": "llama", "namespace": "team-a", "endpoints": [upstream.address]},
        {"name": "llama", "namespace": "team-b", "endpoints": [upstream.address]},
        {"name": "other", "endpoints": [upstream.address]}]})
    r = httpc.request(t.host, t.port, "GET", "/models/team-b/llama/echo", {"Host": "x"})
    assert r.status == 200
    text = get_metrics(t).body.decode()
    samples = check_exposition(text)
    for fam, lines in samples.items():
        series = [line.rsplit(" ", 1)[0] for line in lines]
        assert len(series) == len(set(series)), f"{fam}: a series twice"
    ready = samples["thaw_replicas_ready"]
    assert 'thaw_replicas_ready{model="llama",namespace="team-a"} 1' in ready
    assert 'thaw_replicas_ready{model="other"} 1' in ready
    assert ('thaw_requests_total{model="llama",namespace="team-b",code="200"} 1'
            in samples["thaw_requests_total"])


def test_client_leaving_mid_scrape_frees_it(thaw_factory, upstream):
    import socket
    t = thaw_factory(many_models(upstream))
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", t.admin_port), timeout=10)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n")
        s.recv(1000)
        s.close()
    r = get_metrics(t)
    assert r.status == 200 and check_exposition(r.body.decode())
    assert t.admin("/healthz")[0] == 200


SCRAPER = """
import sys, time, urllib.request
url, seconds = sys.argv[1], float(sys.argv[2])
end = time.monotonic() + seconds
n = 0
while time.monotonic() < end:
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200 and r.read().endswith(b"\\n")
    n += 1
print(n)
"""


def test_proxied_requests_flow_during_scrapes(thaw_factory, sims):
    # The replica and the scraper run in their own processes: the latency
    # measured here is thaw's.
    # More models than the other tests, so a whole-exposition render (the
    # old way) stands out clearly from the noise of a busy machine.
    sim = sims("sim")
    t = thaw_factory({"models": [{"name": f"model-{i:04d}", "endpoints": [sim.address],
                                  "max_concurrency": 8} for i in range(3 * N_MODELS)]})
    s = t.connect()
    rd = httpc.Reader(s)

    def timed(seconds):
        out = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            httpc.send(s, "GET", "/health", host="model-0001")
            assert rd.response().status == 200
            out.append(time.perf_counter() - t0)
        return sorted(out)

    quiet = timed(1.0)
    scraper = subprocess.Popen([sys.executable, "-c", SCRAPER,
                                f"http://{t.admin_addr}/metrics", "3"],
                               stdout=subprocess.PIPE, text=True)
    time.sleep(0.2)
    busy = timed(2.0)
    out, _ = scraper.communicate(timeout=60)
    s.close()
    assert scraper.returncode == 0
    pct = lambda v, q: v[min(len(v) - 1, int(len(v) * q))] * 1000
    print(f"proxied without scrapes: p50 {pct(quiet, .5):.2f} ms p99 {pct(quiet, .99):.2f} ms; "
          f"during {out.strip()} scrapes: p50 {pct(busy, .5):.2f} ms p99 {pct(busy, .99):.2f} ms "
          f"max {busy[-1] * 1000:.2f} ms ({len(busy)} requests)")
    # Rendering the whole exposition at once held every proxied request for
    # the whole render (tens of milliseconds per scrape, and more). A machine
    # busy with other work slows the quiet requests too: the bound grows
    # with them, never below 15 ms.
    assert pct(busy, .99) < max(15 * SLOW, 4 * pct(quiet, .99))
