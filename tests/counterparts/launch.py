"""Starting and stopping the counterpart servers from pytest.

    from launch import start, free_port
    with start("uvicorn", "--load-seconds", "2", "--loading-mode", "503") as srv:
        ... 127.0.0.1:srv.port ...

Each server prints `LISTENING <port>` when it accepts connections; start()
waits for that line.  For bind-late servers whose port a test must know before
they listen, pass port=free_port() and wait=False, then srv.wait_listening().
"""
import os
import select
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYTHON = "/usr/bin/python3"
SCRIPTS = {
    "asyncio": HERE / "asyncio_server.py",
    "uvicorn": HERE / "uvicorn_app.py",
    "raw": HERE / "raw_upstream.py",
}


def free_port() -> int:
    """A port that was free a moment ago on 127.0.0.1 (bind to 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A started counterpart: .port, .pid, .popen; stop(), kill(), wait_listening()."""

    def __init__(self, kind, popen, port, stderr_file):
        self.kind = kind
        self.popen = popen
        self.pid = popen.pid
        self.port = port
        self._stderr_file = stderr_file
        self.listening = False

    def wait_listening(self, timeout=15.0) -> int:
        """Waits for the `LISTENING <port>` line; returns and sets .port."""
        if self.listening:
            return self.port
        deadline = time.monotonic() + timeout
        line = b""
        out = self.popen.stdout
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                err = self.stderr_text()[-2000:]
                self.kill()
                raise TimeoutError(f"{self.kind} counterpart did not listen within {timeout}s: "
                                   f"{err}")
            ready, _, _ = select.select([out], [], [], min(left, 0.1))
            if not ready:
                continue
            ch = os.read(out.fileno(), 1)
            if not ch:
                self.popen.wait(5)
                err = self.stderr_text()[-2000:]
                self._close()
                raise RuntimeError(f"{self.kind} counterpart exited with {self.popen.returncode} "
                                   f"before listening: {err}")
            line += ch
        word, _, port = line.decode().strip().partition(" ")
        if word != "LISTENING" or not port.isdigit():
            err = self.stderr_text()[-2000:]
            self.kill()
            raise RuntimeError(f"unexpected first line from {self.kind} counterpart: {line!r} "
                               f"{err}")
        self.port = int(port)
        self.listening = True
        return self.port

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace=5.0):
        """SIGTERM, then SIGKILL after `grace` seconds; waits for the process."""
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close()

    def kill(self):
        """SIGKILL and wait."""
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.popen.wait(10)
        self._close()

    def stderr_text(self) -> str:
        try:
            with open(self._stderr_file.name, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _close(self):
        """Releases the pipe and the stderr log once the process is gone."""
        if self.popen.stdout and not self.popen.stdout.closed:
            self.popen.stdout.close()
        self._stderr_file.close()
        try:
            os.unlink(self._stderr_file.name)
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start(kind, *args, port=None, wait=True, timeout=15.0, env=None) -> Proc:
    """Starts counterpart `kind` ("asyncio", "uvicorn" or "raw") with the given options.

    port: passed as --port (default 0, an ephemeral port); .port is set at once when
    given, else from the LISTENING line.  wait=False returns without waiting for
    that line (call wait_listening() later) - for bind-late servers.
    """
    if kind not in SCRIPTS:
        raise ValueError(f"unknown counterpart kind {kind!r}; one of {sorted(SCRIPTS)}")
    args = [str(a) for a in args]
    if "--port" in args:
        if port is not None:
            raise ValueError("port given twice")
        port = int(args[args.index("--port") + 1])
    else:
        args += ["--port", str(port if port is not None else 0)]
    stderr_file = tempfile.NamedTemporaryFile(prefix=f"counterpart-{kind}-", suffix=".log",
                                              delete=False)
    popen = subprocess.Popen([PYTHON, str(SCRIPTS[kind]), *args], stdout=subprocess.PIPE,
                             stderr=stderr_file, stdin=subprocess.DEVNULL,
                             start_new_session=True, env=env)
    proc = Proc(kind, popen, port or None, stderr_file)
    if wait:
        proc.wait_listening(timeout)
    return proc
