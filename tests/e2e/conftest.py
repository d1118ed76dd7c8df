"""Fixtures for end-to-end tests: the real thaw binary on loopback, port 0."""

import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request

import pytest

from upstream import Upstream

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
THAW_BIN = os.environ.get("THAW_BIN", os.path.join(ROOT, "build", "thaw"))


def wait_for(pred, timeout=10.0, interval=0.01, what="condition"):
    """Polls pred until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


class Thaw:
    def __init__(self, config, extra_args=(), preexec_fn=None):
        self.dir = tempfile.mkdtemp(prefix="thaw-e2e-")
        self.config_path = os.path.join(self.dir, "config.json")
        cfg = {"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0"}
        cfg.update(config)
        with open(self.config_path, "w") as f:
            json.dump(cfg, f, indent=2)
        self.port_file = os.path.join(self.dir, "ports.json")
        self.log_path = os.path.join(self.dir, "thaw.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [THAW_BIN, "--config", self.config_path, "--port-file", self.port_file, *extra_args],
            stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=preexec_fn)
        ports = wait_for(self._read_ports, what="thaw port file")
        self.addr = ports["listen"]
        self.admin_addr = ports["admin_listen"]
        self.host, port = self.addr.rsplit(":", 1)
        self.port = int(port)
        self.admin_port = int(self.admin_addr.rsplit(":", 1)[1])

    def _read_ports(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"thaw exited with {self.proc.returncode}: {self.logs()}")
        try:
            with open(self.port_file) as f:
                return json.load(f)
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def logs(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    @property
    def url(self):
        return f"http://{self.addr}"

    def admin(self, path):
        with urllib.request.urlopen(f"http://{self.admin_addr}{path}", timeout=10) as r:
            return r.status, r.read().decode()

    def status(self):
        return json.loads(self.admin("/status")[1])

    def metrics(self):
        """Parses /metrics into {(name, frozenset(labels)): value}."""
        _, text = self.admin("/metrics")
        out = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name_labels, value = line.rsplit(" ", 1)
            labels = {}
            if "{" in name_labels:
                name, rest = name_labels.split("{", 1)
                for part in rest.rstrip("}").split(","):
                    if part:
                        k, v = part.split("=", 1)
                        labels[k] = v.strip('"')
            else:
                name = name_labels
            out[(name, frozenset(labels.items()))] = float(value)
        return out

    def metric(self, name, **labels):
        return self.metrics().get((name, frozenset(labels.items())), 0.0)

    def assert_reconciled(self, timeout=10):
        """Every accepted request ended as proxied, rejected or aborted."""
        def check():
            m = self.metrics()
            g = lambda n: m.get((n, frozenset()), 0.0)
            acc = g("thaw_requests_accepted_total")
            done = (g("thaw_requests_proxied_total") + g("thaw_requests_rejected_total")
                    + g("thaw_requests_aborted_total"))
            return (acc == done and g("thaw_requests_inflight") == 0, (acc, done))
        deadline = time.monotonic() + timeout
        while True:
            ok, figures = check()
            if ok:
                return figures
            if time.monotonic() > deadline:
                raise AssertionError(f"counters do not reconcile: accepted/finished={figures}")
            time.sleep(0.02)

    def connect(self, timeout=10):
        s = socket.create_connection((self.host, self.port), timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


@pytest.fixture
def upstream():
    u = Upstream().start()
    yield u
    u.stop()


@pytest.fixture
def upstream2():
    u = Upstream().start()
    yield u
    u.stop()


@pytest.fixture
def thaw_factory():
    started = []

    def make(config, extra_args=(), preexec_fn=None):
        t = Thaw(config, extra_args, preexec_fn)
        started.append(t)
        return t

    yield make
    for t in started:
        rc = t.stop()
        assert rc == 0, f"thaw exited with {rc}:\n{t.logs()}"


class Busy:
    """Keeps a model busy: n threads send request() back to back until the
    block ends; statuses holds every answer's status."""

    def __init__(self, request, n=2):
        self.request, self.statuses = request, []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop) for _ in range(n)]

    def _loop(self):
        while not self.stop.is_set():
            self.statuses.append(self.request().status)

    def __enter__(self):
        for th in self.threads:
            th.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for th in self.threads:
            th.join(60)


def free_port():
    """A loopback port with nothing listening (for connect-failure tests)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def pytest_configure(config):
    # Tests whose time is mostly waiting on thaw's timers (idle clocks, leases,
    # event aggregation): the sanitizer run leaves them out (-m "not
    # timer_heavy"), shorter tests cover the same code under the sanitizers.
    config.addinivalue_line("markers", "timer_heavy: mostly waits on timers")
