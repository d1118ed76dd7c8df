"""The data path under replica faults: requests re-queued after a failed
connect, pooled connections the replica closed or reset, replicas killed
mid-stream, broken responses. Fault injection comes from the independent
counterparts in tests/counterparts (a scriptable raw upstream, an asyncio
model server, a real uvicorn app)."""

import json
import sys
import threading
import time
from pathlib import Path

import pytest

import httpc
from conftest import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "counterparts"))


def get(t, path, host, **kw):
    return httpc.request(t.host, t.port, "GET", path, headers={"Host": host}, **kw)


def test_requeued_request_keeps_its_full_queue_deadline(thaw_factory, upstream):
    """Sent straight to a replica that refuses, then put back in the queue
    while the other replica is busy: the request waits for that replica
    (within its 60 s queue timeout) instead of answering 504 at once."""
    dead = f"127.0.0.1:{free_port()}"
    t = thaw_factory({"models": [{"name": "llama", "endpoints": [upstream.address, dead],
                                  "max_concurrency": 1, "queue_timeout_ms": 60000}]})
    results = {}

    def busy():
        results["a"] = get(t, "/sleep?ms=1200", host="llama")

    a = threading.Thread(target=busy)
    a.start()
    time.sleep(0.3)  # A holds the only working replica's one slot
    start = time.monotonic()
    b = get(t, "/echo", host="llama")
    waited = time.monotonic() - start
    a.join()
    assert results["a"].status == 200
    assert b.status == 200, b.body
    assert waited > 0.5  # it waited for A's slot
    assert t.metric("thaw_upstream_connect_failures_total") >= 1
    t.assert_reconciled()
