#!/usr/bin/python3
"""Runs a Python server script as if inside a pod's network namespace.

usage: pod_netns.py POD_IP SCRIPT [ARGS...]

In a pod, a server that binds 127.0.0.1 or 0.0.0.0 is bound in the pod's own
network namespace and reachable at the pod IP. The simulated pods share the
host's loopback instead, each with its own 127.N.x.y address, so an IPv4
bind to 127.0.0.1, 0.0.0.0 or "" lands on POD_IP. The script runs unchanged
(as __main__, with ARGS as its argv).
"""
import os
import runpy
import socket
import sys

if len(sys.argv) < 3:
    sys.exit(__doc__)
POD_IP, SCRIPT = sys.argv[1], sys.argv[2]
_bind = socket.socket.bind


def bind(self, address):
    if self.family == socket.AF_INET and isinstance(address, tuple) and \
            address[0] in ("127.0.0.1", "0.0.0.0", "", "localhost"):
        address = (POD_IP,) + tuple(address[1:])
    return _bind(self, address)


socket.socket.bind = bind
sys.argv = [SCRIPT] + sys.argv[3:]
sys.path.insert(0, os.path.dirname(os.path.abspath(SCRIPT)))
runpy.run_path(SCRIPT, run_name="__main__")
