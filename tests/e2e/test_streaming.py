"""End-to-end: token streams through thaw's replica reads (edge-triggered,
read until drained within a budget a turn, paused while the client is
behind): bursts, slow readers, clients that leave."""

import json
import socket
import time

import httpc
from conftest import wait_for


def model(upstream):
    return {"name": "llama", "endpoints": [upstream.address], "max_concurrency": 8}


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def tokens(body):
    """The delta contents of an OpenAI-style event stream, and whether it
    ended with [DONE]."""
    out, done = [], False
    for event in body.split(b"\n\n"):
        if not event.startswith(b"data: "):
            continue
        data = event[len(b"data: "):]
        if data == b"[DONE]":
            done = True
            continue
        out.append(json.loads(data)["choices"][0]["delta"]["content"])
    return out, done


def expected(n):
    return [f"tok{i} " for i in range(n)]


def test_burst_of_10000_tiny_events_arrives_whole_and_in_order(thaw_factory, upstream):
    """The replica writes 10,000 events at once: they reach thaw in large
    reads, several per turn, each cut anywhere; every one arrives intact."""
    t = thaw_factory({"models": [model(upstream)]})
    s = t.connect()
    httpc.send(s, "GET", "/sse?n=10000", host="llama")
    r = httpc.Reader(s).response()
    assert r.status == 200 and r.header("transfer-encoding") == "chunked"
    got, done = tokens(r.body)
    assert got == expected(10000) and done
    # The connection stays usable: the next request on it is answered.
    httpc.send(s, "GET", "/sse?n=3", host="llama")
    got, done = tokens(httpc.Reader(s).response().body)
    assert got == expected(3) and done
    t.assert_reconciled()


def test_slow_reader_of_a_fast_stream_gets_every_event_with_bounded_memory(thaw_factory,
                                                                          upstream):
    """A client that reads in small sips while the replica bursts 5,000
    events: whatever thaw cannot send at once waits in its output (up to the
    64 KiB high-water mark, when it stops reading the replica until the client
    catches up); nothing is lost and thaw's memory stays flat."""
    t = thaw_factory({"models": [model(upstream)]})
    before = rss_kib(t.proc.pid)
    s = t.connect()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    n = 5000
    httpc.send(s, "GET", f"/sse?n={n}", host="llama")
    s.settimeout(20)
    pieces, reads, peak, tail = [], 0, before, b""
    # The last chunk may arrive split over two reads.
    while not tail.endswith(b"\r\n0\r\n\r\n"):
        piece = s.recv(2048)
        assert piece, "closed before the end of the stream"
        pieces.append(piece)
        tail = (tail + piece)[-16:]
        reads += 1
        if reads % 16 == 0:
            time.sleep(0.002)
        if reads % 64 == 0:
            peak = max(peak, rss_kib(t.proc.pid))
    data = b"".join(pieces)
    head, _, chunked = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    body, rest = b"", chunked
    while True:
        size, _, rest = rest.partition(b"\r\n")
        size = int(size, 16)
        if size == 0:
            break
        body, rest = body + rest[:size], rest[size + 2:]
    got, done = tokens(body)
    assert got == expected(n) and done
    # At most the client-side high-water mark (64 KiB) and one read are held.
    assert peak - before < 4096, f"RSS grew {peak - before} KiB"
    t.assert_reconciled()


def test_a_client_reading_slowly_but_steadily_is_not_cut_by_the_send_timeout(thaw_factory,
                                                                             upstream):
    """A large answer to a client reading 32 KiB every 100 ms: thaw's socket
    buffer to it stays nearly full, and the kernel reports room only once a
    good part of it is free, so for seconds thaw sees no write event. The
    client reads all the while: send_timeout_ms (2 s here) must not cut it.
    One that stops reading is still cut."""
    t = thaw_factory({"limits": {"send_timeout_ms": 2000}, "models": [model(upstream)]})
    s = t.connect()
    httpc.send(s, "GET", "/big?bytes=200000000", host="llama")
    s.settimeout(10)
    got, start = 0, time.monotonic()
    while time.monotonic() - start < 7:
        piece = s.recv(32768)
        assert piece, f"cut after {got} bytes and {time.monotonic() - start:.1f} s"
        got += len(piece)
        time.sleep(0.1)
    assert t.metric("thaw_aborts_total", reason="send_timeout") == 0
    # Now it stops reading: cut within the timeout (and the kernel's buffers).
    stopped = time.monotonic()
    wait_for(lambda: t.metric("thaw_aborts_total", reason="send_timeout") == 1, timeout=15,
             what="the stopped reader cut")
    assert time.monotonic() - stopped < 8
    s.close()


def test_client_leaving_mid_stream_closes_the_replica_connection(thaw_factory, upstream):
    """The client hangs up while the replica streams: thaw closes the replica's
    connection at once (the replica stops generating) and counts one client
    abort, no replica error."""
    t = thaw_factory({"models": [model(upstream)]})
    s = t.connect()
    httpc.send(s, "GET", "/sse?n=500&ms=20", host="llama")
    assert s.recv(100)
    wait_for(lambda: upstream.active == 1, 2, what="the replica streaming")
    s.close()
    # 500 events 20 ms apart take 10 s: ending within 3 s means the
    # replica's writes failed on a connection thaw closed.
    wait_for(lambda: upstream.active == 0, 3, what="the replica's connection closed")
    t.assert_reconciled()
    assert t.metric("thaw_aborts_total", reason="client_closed") == 1
    assert t.metric("thaw_upstream_errors_total", model="llama") == 0
