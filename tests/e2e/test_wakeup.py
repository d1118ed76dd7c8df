"""Waking a model: how held requests reach a replica that just became ready.

Run against the independently written asyncio model server
(tests/counterparts/asyncio_server.py) in both of its loading modes: it binds
only once loaded, or answers 503 while loading.
"""

import json
import subprocess
import threading
import time
import urllib.request

import pytest

import httpc
from conftest import free_port, wait_for
from test_upstream_faults import COUNTERPARTS, PY, counterpart_model


def server_stats(t, name="llama"):
    m = next(m for m in t.status()["models"] if m["name"] == name)
    port = m["processes"][0]["port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as r:
        return json.load(r)


def complete(t, timeout=60):
    body = json.dumps({"model": "llama", "prompt": "hi"}).encode()
    return httpc.request(t.host, t.port, "POST", "/v1/completions",
                         {"Content-Type": "application/json"}, body, timeout=timeout)


def listen_overflows():
    """The kernel's count of connections dropped because a listen queue was
    full (TcpExt ListenOverflows)."""
    with open("/proc/net/netstat") as f:
        lines = f.read().splitlines()
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            row = dict(zip(names.split()[1:], values.split()[1:]))
            return int(row["ListenOverflows"])
    raise AssertionError("no TcpExt in /proc/net/netstat")


def burst(t, n, timeout=60):
    """n completions at once, each on its own connection; their statuses."""
    statuses = []
    lock = threading.Lock()

    def one():
        try:
            s = complete(t, timeout).status
        except Exception as e:  # noqa: BLE001 - reported by the caller
            s = repr(e)
        with lock:
            statuses.append(s)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout + 30)
    return statuses


@pytest.mark.parametrize("mode", ["bind-late", "503"])
def test_first_request_goes_out_on_the_probes_connection(thaw_factory, mode):
    """The connection the readiness probe succeeded on is kept and carries the
    first held request: the server accepts no connection for it, so a server
    slow to accept does not delay the first answer."""
    t = thaw_factory({"models": [counterpart_model(
        "asyncio_server.py", "llama", "--load-seconds", "0.8", "--loading-mode", mode,
        "--accept-delay-ms", "50")]})
    r = complete(t)
    assert r.status == 200, r.body
    st = server_stats(t)
    # Every connection the server accepted (but the one this /stats came on)
    # carried a health check (503 ones while loading, then the 200); the
    # completion needed none of its own.
    assert st["by_path"].get("/v1/completions") == 1, st
    assert st["connections"] - 1 == st["requests"] - 1, st
    t.assert_reconciled()


def burst_model(thaw_factory, n, *server_args):
    """thaw with one model on the asyncio counterpart (server_args), room for
    n requests at once everywhere: queue, connections and max_concurrency."""
    return thaw_factory({
        "limits": {"max_connections": n + 50, "max_queue_per_model": n + 50,
                   "max_queue_total": n + 50},
        "models": [counterpart_model("asyncio_server.py", "llama", *server_args,
                                     max_concurrency=n, queue_timeout_ms=60000)]})


# The kernel counts listen-queue overflows for the whole machine: the tests
# that cause them and those that assert none run one after the other.
overflow_group = pytest.mark.xdist_group("listen_overflows")


@overflow_group
def test_a_burst_released_on_wake_does_not_overflow_the_servers_backlog(thaw_factory):
    """300 requests held while a model loads are released when it wakes. The
    server (asyncio, accepting one connection at a time, a 100-connection
    backlog as asyncio's default) must not see its listen queue overflow: a
    dropped connection attempt costs the request a second or more."""
    n = 300
    t = burst_model(thaw_factory, n, "--load-seconds", "1.5", "--backlog", "100",
                    "--accept-delay-ms", "1")
    before = listen_overflows()
    statuses = burst(t, n)
    assert statuses.count(200) == n, [s for s in statuses if s != 200][:5]
    assert listen_overflows() - before == 0
    t.assert_reconciled()


@overflow_group
def test_requests_slow_to_answer_do_not_hold_the_next_ones_back(thaw_factory):
    """200 requests held while a model loads, each answered 1.5 s after it
    arrives (a non-streaming completion): all 200 must reach the server at
    once (max_concurrency is 200), not 64 at a time while the first ones
    are worked on. The server has accepted them all; thaw learns it from a
    health request on a connection of its own, which the server's accept
    queue hands over only after the earlier ones."""
    n = 200
    t = burst_model(thaw_factory, n, "--load-seconds", "0.5", "--backlog", "100",
                    "--token-delay-ms", "150", "--tokens", "10")
    before = listen_overflows()
    statuses = burst(t, n)
    assert statuses.count(200) == n, [s for s in statuses if s != 200][:5]
    st = server_stats(t)
    assert st["max_inflight"] >= n - 5, st
    assert t.metric("thaw_upstream_accept_checks_total") >= 1
    assert listen_overflows() - before == 0
    t.assert_reconciled()


@overflow_group
def test_a_server_with_a_tiny_listen_backlog_gets_a_burst_without_long_waits(thaw_factory):
    """cpp-httplib, under llama.cpp's server, listens with a backlog of 5 by
    default: a burst of new connections overflows it and the kernel drops
    the SYNs past it, which a client sends again only 1, 3, 7, 15... s
    later. thaw makes a connect that stalls again itself within
    milliseconds, and opens fewer at once to that replica from then on: 64
    requests held while the model loads are all answered within seconds
    (on the code before, some waited a minute or more)."""
    n = 64
    t = burst_model(thaw_factory, n, "--load-seconds", "0.5", "--backlog", "5",
                    "--accept-delay-ms", "1")
    started = time.monotonic()
    statuses = burst(t, n, timeout=30)
    took = time.monotonic() - started
    assert statuses.count(200) == n, [s for s in statuses if s != 200][:5]
    assert took < 10, took
    assert t.metric("thaw_upstream_connect_stalls_total") >= 1
    t.assert_reconciled()


@pytest.fixture
def configured_server():
    """The asyncio counterpart run by the test, for a model configured by
    address (`endpoints`) rather than started by thaw; its port."""
    port = free_port()
    proc = subprocess.Popen(
        [PY, str(COUNTERPARTS / "asyncio_server.py"), "--port", str(port), "--model", "llama",
         "--backlog", "100", "--token-delay-ms", "150", "--tokens", "10"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def up():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    return r.status == 200
            except OSError:
                return False
        wait_for(up, timeout=20, what="the asyncio server")
        yield port
    finally:
        proc.kill()
        proc.wait()


def test_slow_answers_from_a_configured_address_do_not_hold_the_next_ones_back(
        thaw_factory, configured_server):
    """A model server configured by address (a vLLM at a fixed IP), and 200
    completions at once, each answered 1.5 s after it arrives: all 200 must
    reach the server at once (max_concurrency is 200), not 64 at a time while
    the first ones are worked on. An address may be a load balancer's, so
    thaw infers nothing from the order of answers here: a completed
    handshake shows the connection is in a listen queue, and that is what it
    waits for."""
    n = 200
    t = thaw_factory({
        "limits": {"max_connections": n + 50, "max_queue_per_model": n + 50,
                   "max_queue_total": n + 50},
        "models": [{"name": "llama", "endpoints": [f"127.0.0.1:{configured_server}"],
                    "max_concurrency": n, "queue_timeout_ms": 60000}]})
    statuses = burst(t, n)
    assert statuses.count(200) == n, [s for s in statuses if s != 200][:5]
    with urllib.request.urlopen(f"http://127.0.0.1:{configured_server}/stats", timeout=10) as r:
        st = json.load(r)
    assert st["max_inflight"] >= n - 5, st
    t.assert_reconciled()
