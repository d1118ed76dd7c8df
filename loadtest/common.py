"""Helpers the load tests share: start thaw on a config, read its ports,
read a process's RSS, wait for a file."""

import json
import os
import subprocess
import time


def wait_file(path, timeout=20):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear")
        time.sleep(0.01)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def start_thaw(thaw_bin, workdir, cfg, extra_args=()):
    """Starts thaw on cfg (listen addresses on port 0); returns (process,
    proxy port, admin address) once it wrote its port file."""
    with open(f"{workdir}/thaw.json", "w") as f:
        json.dump(cfg, f)
    pf = f"{workdir}/thaw-ports.json"
    if os.path.exists(pf):
        os.unlink(pf)
    p = subprocess.Popen([thaw_bin, "--config", f"{workdir}/thaw.json", "--port-file", pf,
                          *extra_args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_file(pf)
    with open(pf) as f:
        ports = json.load(f)
    return p, int(ports["listen"].rsplit(":", 1)[1]), ports["admin_listen"]
