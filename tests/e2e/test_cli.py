"""The command line: help, version, config checking and overrides."""

import json
import os
import shutil
import subprocess
import tempfile

import pytest

import httpc
from conftest import THAW_BIN, ROOT, Thaw


def run(*args):
    return subprocess.run([THAW_BIN, *args], capture_output=True, text=True, timeout=30)


def write(text):
    fd, path = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def test_help_and_version():
    r = run("--help")
    assert r.returncode == 0 and "--check-config" in r.stdout and "--port-file" in r.stdout
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("thaw ")
    r = run("--no-such-flag")
    assert r.returncode == 2


def test_check_config_accepts_the_shipped_examples():
    for name in ("demo.json", "example.json"):
        r = run("--check-config", os.path.join(ROOT, "config", name))
        assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("text,where", [
    ('{\n  "listen": "127.0.0.1:1",\n  "limts": {}\n}', ":3: limts: unknown key"),
    ('{"limits": {\n  "max_body_bytes": -1\n}}', ":2: limits.max_body_bytes: must be a whole"),
    ('{"models": [\n {"name": "m",\n  "endpoints": ["127.0.0.1:1"],\n  "max_concurrency": 0}]}',
     ":4: models[0].max_concurrency: must be between 1 and 100000 (got 0)"),
    ('{"models": [', ":1: (syntax)"),
    ('{}\n xyz\n', ":2: (syntax): unexpected content after the JSON object"),
    ('{"models": [\n {"name": "a\\u0000b", "endpoints": ["127.0.0.1:1"]}]}',
     ":2: models[0].name: a string holds a NUL character"),
    ('{"models": [\n {"name": "m",\n  "endpoints": ["no-such-host.invalid:8000"]}]}',
     ':3: models[0].endpoints[0]: host "no-such-host.invalid" does not resolve'),
    ('{"models": [\n {"name": "' + "n" * 300 + '", "endpoints": ["127.0.0.1:1"]}]}',
     ":2: models[0].name: is too long (300 characters; at most 253)"),
])
def test_check_config_errors_name_file_line_key(text, where):
    path = write(text)
    r = run("--check-config", path)
    assert r.returncode == 1
    assert f"{path}{where}" in r.stderr, r.stderr
    r = run("--config", path)
    assert r.returncode == 1 and where in r.stderr


def test_missing_config_file():
    r = run("--check-config", "/nonexistent.json")
    assert r.returncode == 1 and "cannot open" in r.stderr


def test_check_config_rejects_a_key_given_twice_in_a_gpu():
    path = write('{"gpus": [\n {"id": 0,\n  "id": 1}]}')
    r = run("--check-config", path)
    assert r.returncode == 1
    assert f"{path}:3: gpus[0].id: duplicate key" in r.stderr, r.stderr


def test_listen_overrides_and_bad_override(upstream):
    path = write(json.dumps({"listen": "127.0.0.1:1", "admin_listen": "127.0.0.1:2",
                             "models": [{"name": "m", "endpoints": [upstream.address]}]}))
    r = run("--config", path, "--listen", "nonsense")
    assert r.returncode == 2 and "--listen: must be" in r.stderr
    t = Thaw({"models": [{"name": "m", "endpoints": [upstream.address]}]},
             ["--listen", "127.0.0.1:0", "--admin-listen", "[::1]:0"])
    try:
        assert t.admin_addr.startswith("[::1]:")
        assert httpc.request(t.host, t.port, path="/echo", headers={"Host": "m"}).status == 200
    finally:
        assert t.stop() == 0


def test_port_in_use_is_a_clear_error(upstream):
    t = Thaw({"models": []})
    try:
        path = write(json.dumps({"listen": t.addr, "admin_listen": "127.0.0.1:0"}))
        r = run("--config", path)
        assert r.returncode == 1 and "cannot listen" in r.stderr
    finally:
        t.stop()


def test_a_reload_asked_for_while_starting_does_not_end_thaw(tmp_path):
    """A service manager may send SIGHUP right after the start, before thaw's
    loop has its reload handler (here: while GPU discovery holds the start for
    a second). SIGHUP's default action ended thaw; the reload must not be lost
    either."""
    import signal
    import time
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({
        "listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "gpus": "discover",
        "gpu_discovery_command": ["sh", "-c",
                                  "sleep 1; echo 'GPU 0: Test GPU (UUID: GPU-0000)'"],
        "models": [{"name": "m", "command": ["/bin/true", "{port}"], "gpu_slices": 1}]}))
    ports = tmp_path / "ports.json"
    p = subprocess.Popen([THAW_BIN, "--config", str(cfg), "--port-file", str(ports)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.4)  # thaw waits for the discovery command
        assert p.poll() is None
        conf = json.loads(cfg.read_text())
        conf["models"].append({"name": "added", "endpoints": ["127.0.0.1:9"]})
        cfg.write_text(json.dumps(conf))
        p.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while not ports.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert p.poll() is None and ports.exists(), f"thaw ended (status {p.returncode})"
        # Nor is the reload lost: the model the file gained meanwhile is there.
        admin = json.loads(ports.read_text())["admin_listen"]
        host, port = admin.rsplit(":", 1)

        def names():
            r = httpc.request(host, int(port), "GET", "/status", {}, b"", timeout=5)
            return [m["name"] for m in json.loads(r.body)["models"]]
        deadline = time.monotonic() + 5
        while "added" not in names() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "added" in names()
    finally:
        p.terminate()
        p.wait(10)
