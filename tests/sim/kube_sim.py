#!/usr/bin/python3
"""A Kubernetes API server simulator for thaw's tests (Python standard library).

It serves the API paths thaw uses, in the Kubernetes shape, and simulates the
cluster behind them:

  /api, /api/v1, /apis, /apis/{group}/{version}, /version   discovery
  core/v1 pods, nodes, events, services (read)               list, watch, get, create, delete
  apps/v1 deployments (+ /scale)                             list, watch, get, create, update,
                                                             merge-patch, delete
  discovery.k8s.io/v1 endpointslices                         list, watch, get
  coordination.k8s.io/v1 leases                              list, watch, get, create, update,
                                                             delete

Lists carry resourceVersion; watches stream one JSON event per line
(chunked) with BOOKMARKs when asked (allowWatchBookmarks) and end after
timeoutSeconds; label selectors (=, ==, !=, exists, !exists, in, notin) and
metadata.name/namespace field selectors; 409 on a stale resourceVersion or an
existing name; a watch from a resourceVersion older than the retained history
gets an ERROR event with a 410 Status (as the real server does). Bearer
tokens (401 otherwise) and TLS (--cert/--key) as the tests set up.

The cluster: Nodes with nvidia.com/gpu allocatable; a Deployment's replicas
become Pods: Pending, then scheduled when a node has the GPUs the pod asks for
(else Pending with an Unschedulable condition), then Running with a loopback
pod IP where a thaw-model-sim process starts (its load time from the
annotation sim.thaw.dev/load-ms); a simulated kubelet probes it every
--kubelet-period-ms and marks it Ready, and the EndpointSlice of the
Deployment's Service (thaw.dev/service, default the Deployment's name)
follows. Scale down: the pod turns Terminating (endpoint terminating), its
process gets SIGTERM, then the pod is gone.

Fault controls (POST /_sim/faults with JSON): {"drop_watches": true},
{"fail_next": N} (next N API requests answer 500), {"delay_ms": N},
{"compact": true} (forget history: old resourceVersions get 410),
{"tokens": [...]} (accepted bearer tokens). GET /_sim/state shows counters.
--state FILE keeps objects across a restart (written on SIGTERM, read at start;
the pods' processes keep running and are adopted, as a node's would). SIGINT
stops everything.
"""

import argparse
import copy
import itertools
import json
import os
import random
import signal
import socket
import ssl
import string
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RESOURCES = {
    # (group, version, plural): (kind, namespaced)
    ("", "v1", "pods"): ("Pod", True),
    ("", "v1", "nodes"): ("Node", False),
    ("", "v1", "events"): ("Event", True),
    ("", "v1", "services"): ("Service", True),
    ("", "v1", "namespaces"): ("Namespace", False),
    ("apps", "v1", "deployments"): ("Deployment", True),
    ("discovery.k8s.io", "v1", "endpointslices"): ("EndpointSlice", True),
    ("coordination.k8s.io", "v1", "leases"): ("Lease", True),
}
SHORT = {"pods": ["po"], "nodes": ["no"], "events": ["ev"], "services": ["svc"],
         "namespaces": ["ns"], "deployments": ["deploy"], "endpointslices": [], "leases": []}


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def now_iso():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def api_version(group, version):
    return f"{group}/{version}" if group else version


def status_obj(code, reason, message, details=None):
    s = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
         "message": message, "reason": reason, "code": code}
    if details:
        s["details"] = details
    return s


class ApiError(Exception):
    def __init__(self, code, reason, message):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def parse_label_selector(sel):
    """Returns a predicate over a labels dict."""
    if not sel:
        return lambda labels: True
    reqs = []
    # split on commas not inside parentheses
    parts, depth, cur = [], 0, ""
    for ch in sel:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    for p in (x.strip() for x in parts):
        if not p:
            continue
        if " notin " in p or " in " in p:
            neg = " notin " in p
            k, vals = p.split(" notin " if neg else " in ", 1)
            vals = {v.strip() for v in vals.strip().strip("()").split(",")}
            reqs.append(lambda l, k=k.strip(), vals=vals, neg=neg:
                        (l.get(k) in vals) != neg if (k in l or not neg) else neg)
        elif "!=" in p:
            k, v = p.split("!=", 1)
            reqs.append(lambda l, k=k.strip(), v=v.strip(): l.get(k) != v)
        elif "==" in p or "=" in p:
            k, v = p.split("==" if "==" in p else "=", 1)
            reqs.append(lambda l, k=k.strip(), v=v.strip(): l.get(k) == v)
        elif p.startswith("!"):
            reqs.append(lambda l, k=p[1:].strip(): k not in l)
        else:
            reqs.append(lambda l, k=p: k in l)
    return lambda labels: all(r(labels or {}) for r in reqs)


def parse_field_selector(sel):
    if not sel:
        return lambda obj: True
    reqs = []
    for p in sel.split(","):
        neg = "!=" in p
        k, v = p.split("!=" if neg else ("==" if "==" in p else "="), 1)
        path = k.strip().split(".")
        reqs.append((path, v.strip(), neg))

    def pred(obj):
        for path, v, neg in reqs:
            cur = obj
            for seg in path:
                cur = cur.get(seg) if isinstance(cur, dict) else None
            if (str(cur) == v) == neg:
                return False
        return True
    return pred


def merge_patch(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


class Store:
    """Objects, resourceVersions and the event history watches read."""

    def __init__(self, history=5000):
        self.lock = threading.Condition()
        self.objects = {}  # (plural, ns, name) -> obj
        self.rv = 100
        self.history = []  # (rv, plural, type, obj)
        self.history_max = history
        self.compacted_rv = self.rv  # history holds events after this rv
        self.watch_generation = 0  # bumped to drop every watch

    def _bump(self):
        self.rv += 1
        return str(self.rv)

    def _record(self, plural, etype, obj):
        self.history.append((int(obj["metadata"]["resourceVersion"]), plural, etype,
                             copy.deepcopy(obj)))
        if len(self.history) > self.history_max:
            drop = len(self.history) - self.history_max
            self.compacted_rv = self.history[drop - 1][0]
            del self.history[:drop]
        self.lock.notify_all()

    def create(self, plural, obj, kind, apiv):
        with self.lock:
            md = obj.setdefault("metadata", {})
            if not md.get("name") and md.get("generateName"):
                md["name"] = md["generateName"] + "".join(
                    random.choices(string.ascii_lowercase + string.digits, k=5))
            key = (plural, md.get("namespace", ""), md["name"])
            if key in self.objects:
                raise ApiError(409, "AlreadyExists",
                               f'{plural} "{md["name"]}" already exists')
            obj["kind"], obj["apiVersion"] = kind, apiv
            md["uid"] = str(uuid.uuid4())
            md["creationTimestamp"] = now_iso()
            md["generation"] = 1
            md["resourceVersion"] = self._bump()
            self.objects[key] = obj
            self._record(plural, "ADDED", obj)
            return copy.deepcopy(obj)

    def get(self, plural, ns, name):
        with self.lock:
            o = self.objects.get((plural, ns, name))
            if o is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
            return copy.deepcopy(o)

    def update(self, plural, ns, name, new, check_rv=True, spec_changed=None):
        with self.lock:
            key = (plural, ns, name)
            cur = self.objects.get(key)
            if cur is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
            want_rv = new.get("metadata", {}).get("resourceVersion")
            if check_rv and want_rv and want_rv != cur["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict",
                               f'Operation cannot be fulfilled on {plural} "{name}": the object '
                               "has been modified; please apply your changes to the latest "
                               "version and try again")
            md = new.setdefault("metadata", {})
            for k in ("uid", "creationTimestamp", "namespace", "name"):
                if k in cur["metadata"]:
                    md[k] = cur["metadata"][k]
            if "deletionTimestamp" in cur["metadata"]:
                md["deletionTimestamp"] = cur["metadata"]["deletionTimestamp"]
            md["generation"] = cur["metadata"].get("generation", 1) + (
                1 if new.get("spec") != cur.get("spec") else 0)
            new["kind"], new["apiVersion"] = cur["kind"], cur["apiVersion"]
            if new == cur:
                return copy.deepcopy(cur)
            md["resourceVersion"] = self._bump()
            self.objects[key] = new
            self._record(plural, "MODIFIED", new)
            return copy.deepcopy(new)

    def delete(self, plural, ns, name):
        with self.lock:
            cur = self.objects.pop((plural, ns, name), None)
            if cur is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
            cur["metadata"]["resourceVersion"] = self._bump()
            self._record(plural, "DELETED", cur)
            return copy.deepcopy(cur)

    def list(self, plural, ns, lsel, fsel):
        with self.lock:
            items = [copy.deepcopy(o) for (p, n, _), o in sorted(self.objects.items())
                     if p == plural and (ns is None or n == ns)
                     and lsel(o["metadata"].get("labels")) and fsel(o)]
            return items, str(self.rv)

    def compact(self):
        """Forgets all history: every resourceVersion handed out so far is
        too old, so watches get 410 Gone and clients must relist."""
        with self.lock:
            self.rv += 1
            self.compacted_rv = self.rv
            self.history = []
            self.lock.notify_all()

    def drop_watches(self):
        with self.lock:
            self.watch_generation += 1
            self.lock.notify_all()

    def dump(self, pids):
        with self.lock:
            return {"rv": self.rv, "pids": pids,
                    "objects": [[list(k), v] for k, v in self.objects.items()]}

    def load(self, data):
        self.rv = data["rv"]
        self.compacted_rv = self.rv
        self.objects = {tuple(k): v for k, v in data["objects"]}
        return data.get("pids", {})


class Cluster:
    """Turns Deployments into Pods, processes and EndpointSlices."""

    def __init__(self, store, args):
        self.store = store
        self.args = args
        self.procs = {}  # pod name -> Popen
        self.adopted = {}  # pod name -> pid, from before a restart
        self.next_probe = {}  # pod name -> monotonic time of the next kubelet probe
        # Pod IPs: 127.<subnet>.x.y, a block of its own per simulator so two
        # simulators on one machine never hand out the same address.
        self.ip_pool = (f"127.{args.pod_subnet}.{i // 250}.{i % 250 + 2}"
                        for i in itertools.count())
        self.lock = threading.Lock()
        self.stop = False

    def start(self):
        threading.Thread(target=self.loop, daemon=True).start()

    def loop(self):
        while not self.stop:
            try:
                self.reconcile()
            except Exception as e:  # keep simulating; report
                print(f"kube-sim: reconcile error: {e!r}", file=sys.stderr)
            time.sleep(self.args.tick_ms / 1000)

    def objects(self, plural):
        return self.store.list(plural, None, lambda l: True, lambda o: True)[0]

    def gpu_request(self, pod):
        total = 0
        for c in pod.get("spec", {}).get("containers", []):
            req = c.get("resources", {}).get("requests", {}) or c.get("resources", {}).get(
                "limits", {})
            total += int(req.get("nvidia.com/gpu", 0))
        return total

    def node_free(self, pods):
        free = {}
        for n in self.objects("nodes"):
            free[n["metadata"]["name"]] = int(n["status"]["allocatable"].get("nvidia.com/gpu", 0))
        for p in pods:
            node = p.get("spec", {}).get("nodeName")
            if node in free and "deletionTimestamp" not in p["metadata"]:
                free[node] -= self.gpu_request(p)
            elif node in free:
                free[node] -= self.gpu_request(p)  # terminating pods hold GPUs until gone
        return free

    def reconcile(self):
        deps = self.objects("deployments")
        pods = self.objects("pods")
        by_dep = {}
        for p in pods:
            owner = p["metadata"].get("labels", {}).get("sim.thaw.dev/deployment")
            if owner:
                by_dep.setdefault((p["metadata"]["namespace"], owner), []).append(p)
        dep_keys = set()
        for d in deps:
            ns, name = d["metadata"]["namespace"], d["metadata"]["name"]
            dep_keys.add((ns, name))
            want = d.get("spec", {}).get("replicas", 1)
            mine = [p for p in by_dep.get((ns, name), []) if "deletionTimestamp" not in p["metadata"]]
            for _ in range(want - len(mine)):
                self.create_pod(d)
            if len(mine) > want:
                mine.sort(key=lambda p: p["metadata"]["creationTimestamp"], reverse=True)
                for p in mine[:len(mine) - want]:
                    self.terminate(p)
            self.update_deployment_status(d, by_dep.get((ns, name), []))
        for (ns, owner), ps in by_dep.items():
            if (ns, owner) not in dep_keys:
                for p in ps:
                    if "deletionTimestamp" not in p["metadata"]:
                        self.terminate(p)
        pods = self.objects("pods")
        free = self.node_free(pods)
        for p in pods:
            self.step_pod(p, free)
        self.sync_endpointslices(deps, self.objects("pods"))

    def create_pod(self, d):
        tpl = d.get("spec", {}).get("template", {})
        name = d["metadata"]["name"] + "-" + "".join(
            random.choices(string.ascii_lowercase + string.digits, k=10))
        labels = dict(tpl.get("metadata", {}).get("labels", {}))
        labels["sim.thaw.dev/deployment"] = d["metadata"]["name"]
        pod = {"metadata": {"name": name, "namespace": d["metadata"]["namespace"],
                            "labels": labels,
                            "annotations": dict(tpl.get("metadata", {}).get("annotations", {})),
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                                 "name": d["metadata"]["name"] + "-rs",
                                                 "uid": d["metadata"]["uid"],
                                                 "controller": True}]},
               "spec": copy.deepcopy(tpl.get("spec", {})),
               "status": {"phase": "Pending", "conditions": []}}
        self.store.create("pods", pod, "Pod", "v1")

    def set_pod(self, p):
        try:
            self.store.update("pods", p["metadata"]["namespace"], p["metadata"]["name"], p,
                              check_rv=False)
        except ApiError:
            pass

    def step_pod(self, p, free):
        md, st = p["metadata"], p.setdefault("status", {})
        name = md["name"]
        if "deletionTimestamp" in md:
            proc = self.procs.get(name)
            if name in self.adopted and pid_alive(self.adopted[name]):
                return
            if proc is None or proc.poll() is not None:
                self.procs.pop(name, None)
                try:
                    self.store.delete("pods", md["namespace"], name)
                except ApiError:
                    pass
            return
        if st.get("phase") == "Pending" and not p["spec"].get("nodeName"):
            need = self.gpu_request(p)
            node = next((n for n, f in sorted(free.items()) if f >= need), None)
            if node is None:
                cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                        "message": f"0/{len(free)} nodes are available: {len(free)} Insufficient "
                                   "nvidia.com/gpu."}
                if st.get("conditions") != [cond]:
                    st["conditions"] = [cond]
                    self.set_pod(p)
                return
            free[node] -= need
            p["spec"]["nodeName"] = node
            st["conditions"] = [{"type": "PodScheduled", "status": "True"}]
            self.set_pod(p)
            return
        if st.get("phase") == "Pending" and p["spec"].get("nodeName"):
            ip = next(self.ip_pool)
            port = self.container_port(p)
            load_ms = md.get("annotations", {}).get("sim.thaw.dev/load-ms",
                                                    str(self.args.load_ms))
            cmd = [self.args.model_sim, "--host", ip, "--port", str(port), "--load-ms", load_ms,
                   "--token-ms", md.get("annotations", {}).get("sim.thaw.dev/token-ms", "5"),
                   "--tokens", "4", "--model", md.get("labels", {}).get("thaw.dev/model", "sim")]
            ready_file = md.get("annotations", {}).get("sim.thaw.dev/ready-file")
            if ready_file:
                cmd += ["--ready-file", ready_file]
            self.procs[md["name"]] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                                      stderr=subprocess.DEVNULL)
            st.update({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                       "hostIP": "127.0.0.1", "startTime": now_iso()})
            st["conditions"] = [{"type": "PodScheduled", "status": "True"},
                                {"type": "Ready", "status": "False"}]
            self.next_probe[name] = time.monotonic() + self.args.kubelet_period_ms / 1000
            self.set_pod(p)
            return
        if st.get("phase") == "Running":
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None:
                st["phase"] = "Failed"
                st["conditions"] = [{"type": "Ready", "status": "False"}]
                self.set_pod(p)
                self.terminate(p)
                return
            ready = any(c["type"] == "Ready" and c["status"] == "True"
                        for c in st.get("conditions", []))
            if not ready and time.monotonic() >= self.next_probe.get(name, 0):
                if self.probe(st["podIP"], self.container_port(p), p):
                    st["conditions"] = [{"type": "PodScheduled", "status": "True"},
                                        {"type": "Ready", "status": "True"}]
                    self.next_probe.pop(name, None)
                    self.set_pod(p)
                else:
                    self.next_probe[name] = time.monotonic() + self.args.kubelet_period_ms / 1000

    def container_port(self, p):
        for c in p["spec"].get("containers", []):
            for port in c.get("ports", []):
                return port["containerPort"]
        return 8000

    def probe(self, ip, port, p):
        path = "/health"
        for c in p["spec"].get("containers", []):
            rp = c.get("readinessProbe", {}).get("httpGet")
            if rp:
                path = rp.get("path", path)
        try:
            s = socket.create_connection((ip, port), timeout=0.5)
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n\r\n".encode())
            data = s.recv(64)
            s.close()
            return data.startswith(b"HTTP/1.1 2")
        except OSError:
            return False

    def terminate(self, p):
        md = p["metadata"]
        if "deletionTimestamp" in md:
            return
        md["deletionTimestamp"] = now_iso()
        proc = self.procs.get(md["name"])
        if proc and proc.poll() is None:
            proc.terminate()
        if md["name"] in self.adopted:
            try:
                os.kill(self.adopted[md["name"]], signal.SIGTERM)
            except ProcessLookupError:
                pass
        self.set_pod(p)

    def update_deployment_status(self, d, pods):
        ready = sum(1 for p in pods if "deletionTimestamp" not in p["metadata"] and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p.get("status", {}).get("conditions", [])))
        live = sum(1 for p in pods if "deletionTimestamp" not in p["metadata"])
        want = {"replicas": live, "readyReplicas": ready, "availableReplicas": ready,
                "updatedReplicas": live, "observedGeneration": d["metadata"]["generation"]}
        cur = d.get("status", {})
        if {k: cur.get(k, 0) for k in want} != want:
            d["status"] = want
            self.set_obj("deployments", d)

    def set_obj(self, plural, o):
        try:
            self.store.update(plural, o["metadata"]["namespace"], o["metadata"]["name"], o,
                              check_rv=False)
        except ApiError:
            pass

    def sync_endpointslices(self, deps, pods):
        for d in deps:
            ns, name = d["metadata"]["namespace"], d["metadata"]["name"]
            svc = d["metadata"].get("annotations", {}).get("thaw.dev/service", name)
            eps = []
            port = 8000
            for p in pods:
                if p["metadata"].get("labels", {}).get("sim.thaw.dev/deployment") != name:
                    continue
                if p["metadata"]["namespace"] != ns or not p.get("status", {}).get("podIP"):
                    continue
                port = self.container_port(p)
                terminating = "deletionTimestamp" in p["metadata"]
                ready = not terminating and any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in p["status"].get("conditions", []))
                eps.append({"addresses": [p["status"]["podIP"]],
                            "conditions": {"ready": ready, "serving": ready or terminating,
                                           "terminating": terminating},
                            "nodeName": p["spec"].get("nodeName"),
                            "targetRef": {"kind": "Pod", "namespace": ns,
                                          "name": p["metadata"]["name"],
                                          "uid": p["metadata"]["uid"]}})
            slice_name = f"{svc}-sim"
            body = {"metadata": {"name": slice_name, "namespace": ns,
                                 "labels": {"kubernetes.io/service-name": svc,
                                            "endpointslice.kubernetes.io/managed-by":
                                                "kube-sim"}},
                    "addressType": "IPv4", "endpoints": eps,
                    "ports": [{"name": "http", "port": port, "protocol": "TCP"}]}
            try:
                cur = self.store.get("endpointslices", ns, slice_name)
                if cur.get("endpoints") != eps or cur.get("ports") != body["ports"]:
                    cur["endpoints"], cur["ports"] = eps, body["ports"]
                    self.set_obj("endpointslices", cur)
            except ApiError:
                self.store.create("endpointslices", body, "EndpointSlice", "discovery.k8s.io/v1")

    def pids(self):
        out = dict(self.adopted)
        out.update({name: p.pid for name, p in self.procs.items() if p.poll() is None})
        return out

    def shutdown(self, keep_pods=False):
        self.stop = True
        if keep_pods:
            return  # the "nodes" keep running their pods while the API restarts
        for pid in self.adopted.values():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "kube-sim/1"

    def log_message(self, fmt, *args):
        if self.server.sim_args.verbose:
            sys.stderr.write("kube-sim: " + (fmt % args) + "\n")

    # -- plumbing --
    def send_json(self, code, obj, extra_headers=None):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (extra_headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(400, "BadRequest", "request body is not JSON")

    def authorized(self):
        tokens = self.server.sim.tokens
        if not tokens:
            return True
        auth = self.headers.get("Authorization", "")
        return auth.startswith("Bearer ") and auth[7:] in tokens

    def handle_any(self, method):
        sim = self.server.sim
        url = urllib.parse.urlsplit(self.path)
        q = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        path = url.path.rstrip("/") or "/"
        try:
            if path.startswith("/_sim/"):
                return self.control(method, path)
            sim.counters["requests"] += 1
            if not self.authorized():
                sim.counters["unauthorized"] += 1
                raise ApiError(401, "Unauthorized", "Unauthorized")
            if sim.delay_ms:
                time.sleep(sim.delay_ms / 1000)
            if sim.fail_next > 0:
                sim.fail_next -= 1
                sim.counters["injected_500"] += 1
                raise ApiError(500, "InternalError", "injected failure")
            if method == "GET" and self.discovery(path):
                return
            self.resource(method, path, q)
        except ApiError as e:
            self.send_json(e.code, status_obj(e.code, e.reason, e.message))
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    def do_PUT(self):
        self.handle_any("PUT")

    def do_PATCH(self):
        self.handle_any("PATCH")

    def do_DELETE(self):
        self.handle_any("DELETE")

    # -- control --
    def control(self, method, path):
        sim = self.server.sim
        if path == "/_sim/state":
            return self.send_json(200, {"counters": sim.counters, "rv": sim.store.rv,
                                        "watches": sim.counters["watches_open"],
                                        "scale_log": sim.scale_log[-1000:]})
        if path == "/_sim/faults" and method == "POST":
            f = self.body() or {}
            if f.get("drop_watches"):
                sim.store.drop_watches()
            if "fail_next" in f:
                sim.fail_next = int(f["fail_next"])
            if "delay_ms" in f:
                sim.delay_ms = int(f["delay_ms"])
            if f.get("compact"):
                sim.store.compact()
            if "tokens" in f:
                sim.tokens = set(f["tokens"])
            return self.send_json(200, {"ok": True})
        raise ApiError(404, "NotFound", "no such control")

    # -- discovery --
    def discovery(self, path):
        if path == "/version":
            self.send_json(200, {"major": "1", "minor": "32", "gitVersion": "v1.32.0-kube-sim",
                                 "platform": "linux/amd64"})
            return True
        if path == "/api":
            self.send_json(200, {"kind": "APIVersions", "versions": ["v1"],
                                 "serverAddressByClientCIDRs": [
                                     {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})
            return True
        if path == "/apis":
            groups = sorted({g for g, _, _ in RESOURCES if g})
            self.send_json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/v1", "version": "v1"}],
                 "preferredVersion": {"groupVersion": f"{g}/v1", "version": "v1"}}
                for g in groups]})
            return True
        parts = path.strip("/").split("/")
        gv = None
        if parts == ["api", "v1"]:
            gv = ("", "v1")
        elif len(parts) == 3 and parts[0] == "apis":
            gv = (parts[1], parts[2])
        if gv is None:
            return False
        res = []
        for (g, v, plural), (kind, namespaced) in RESOURCES.items():
            if (g, v) != gv:
                continue
            verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
            res.append({"name": plural, "singularName": kind.lower(), "namespaced": namespaced,
                        "kind": kind, "verbs": verbs, "shortNames": SHORT.get(plural, [])})
            if plural == "deployments":
                res.append({"name": "deployments/scale", "singularName": "", "namespaced": True,
                            "group": "autoscaling", "version": "v1", "kind": "Scale",
                            "verbs": ["get", "patch", "update"]})
        if not res:
            return False
        self.send_json(200, {"kind": "APIResourceList", "apiVersion": "v1",
                             "groupVersion": api_version(*gv), "resources": res})
        return True

    # -- resources --
    def resource(self, method, path, q):
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis" and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ns = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        if not rest:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        plural = rest[0]
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        key = (group, version, plural)
        if key not in RESOURCES:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        kind, namespaced = RESOURCES[key]
        apiv = api_version(group, version)
        store = self.server.sim.store
        if namespaced and name and ns is None:
            raise ApiError(404, "NotFound", "namespace required")
        if not namespaced:
            ns = ""
        if name is None:
            if method == "GET":
                if (q.get("watch") or "").lower() in ("true", "1"):
                    return self.watch(plural, ns, q)
                items, rv = store.list(plural, ns, parse_label_selector(q.get("labelSelector")),
                                       parse_field_selector(q.get("fieldSelector")))
                return self.send_json(200, {"kind": kind + "List", "apiVersion": apiv,
                                            "metadata": {"resourceVersion": rv},
                                            "items": items})
            if method == "POST":
                obj = self.body() or {}
                obj.setdefault("metadata", {})
                if namespaced:
                    obj["metadata"]["namespace"] = ns
                if plural == "deployments":
                    obj.setdefault("spec", {}).setdefault("replicas", 1)
                return self.send_json(201, store.create(plural, obj, kind, apiv))
            raise ApiError(405, "MethodNotAllowed", "method not allowed")
        if sub == "scale" and plural == "deployments":
            return self.scale(method, ns, name)
        if sub:
            raise ApiError(404, "NotFound", "no such subresource")
        if method == "GET":
            return self.send_json(200, store.get(plural, ns, name))
        if method == "PUT":
            return self.send_json(200, store.update(plural, ns, name, self.body() or {}))
        if method == "PATCH":
            ctype = self.headers.get("Content-Type", "")
            if "merge-patch" not in ctype and "strategic-merge-patch" not in ctype:
                raise ApiError(415, "UnsupportedMediaType", f"patch type {ctype} not supported")
            patch = self.body() or {}
            cur = store.get(plural, ns, name)
            new = merge_patch(cur, patch)
            if not patch.get("metadata", {}).get("resourceVersion"):
                new["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
            return self.send_json(200, store.update(plural, ns, name, new))
        if method == "DELETE":
            store.delete(plural, ns, name)
            return self.send_json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                        "status": "Success",
                                        "details": {"name": name, "kind": plural}})
        raise ApiError(405, "MethodNotAllowed", "method not allowed")

    def scale(self, method, ns, name):
        store = self.server.sim.store
        self.server.sim.counters[f"scale_{method.lower()}"] += 1
        d = store.get("deployments", ns, name)

        def as_scale(dep):
            spec = {}
            if dep.get("spec", {}).get("replicas"):
                spec["replicas"] = dep["spec"]["replicas"]  # omitempty, as the real one
            return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                    "metadata": {"name": name, "namespace": ns,
                                 "uid": dep["metadata"]["uid"],
                                 "resourceVersion": dep["metadata"]["resourceVersion"],
                                 "creationTimestamp": dep["metadata"]["creationTimestamp"]},
                    "spec": spec,
                    "status": {"replicas": dep.get("status", {}).get("replicas", 0),
                               "selector": ",".join(f"{k}={v}" for k, v in dep.get("spec", {})
                                                    .get("selector", {}).get("matchLabels", {})
                                                    .items())}}
        if method == "GET":
            return self.send_json(200, as_scale(d))
        body = self.body() or {}
        if method == "PATCH":
            ctype = self.headers.get("Content-Type", "")
            if "merge-patch" not in ctype:
                raise ApiError(415, "UnsupportedMediaType", f"patch type {ctype} not supported")
            scale = merge_patch(as_scale(d), body)
            want_rv = body.get("metadata", {}).get("resourceVersion")
        elif method == "PUT":
            scale = body
            want_rv = body.get("metadata", {}).get("resourceVersion")
        else:
            raise ApiError(405, "MethodNotAllowed", "method not allowed")
        replicas = int(scale.get("spec", {}).get("replicas") or 0)
        if replicas < 0:
            raise ApiError(422, "Invalid", "spec.replicas: must be >= 0")
        d["spec"]["replicas"] = replicas
        d["metadata"]["resourceVersion"] = want_rv or d["metadata"]["resourceVersion"]
        new = store.update("deployments", ns, name, d)
        self.server.sim.counters["scale_writes"] += 1
        self.server.sim.scale_log.append((name, replicas))
        return self.send_json(200, as_scale(new))

    def watch(self, plural, ns, q):
        sim = self.server.sim
        store = sim.store
        lsel = parse_label_selector(q.get("labelSelector"))
        fsel = parse_field_selector(q.get("fieldSelector"))
        bookmarks = (q.get("allowWatchBookmarks") or "").lower() in ("true", "1")
        timeout = float(q.get("timeoutSeconds") or 1800)
        start_rv = q.get("resourceVersion")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def send(event):
            data = (json.dumps(event) + "\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        deadline = time.monotonic() + timeout
        next_bookmark = time.monotonic() + sim.args.bookmark_s
        sim.counters["watches"] += 1
        sim.counters["watches_open"] += 1
        try:
            with store.lock:
                gen = store.watch_generation
                if start_rv in (None, "", "0"):
                    # Synthetic ADDED for what exists, then changes.
                    items = [copy.deepcopy(o) for (p, n, _), o in sorted(store.objects.items())
                             if p == plural and (ns is None or n == ns)
                             and lsel(o["metadata"].get("labels")) and fsel(o)]
                    pos_rv = store.rv
                    pending = [("ADDED", o) for o in items]
                else:
                    pos_rv = int(start_rv)
                    pending = []
                    if pos_rv < store.compacted_rv:
                        pending = None
            if pending is None:
                send({"type": "ERROR", "object": status_obj(
                    410, "Expired", f"too old resource version: {pos_rv} ({store.compacted_rv})")})
                return self.end_chunks()
            for etype, o in pending:
                send({"type": etype, "object": o})
            while time.monotonic() < deadline:
                with store.lock:
                    if store.watch_generation != gen:
                        break
                    def collect():
                        return [(rv, t, o) for rv, p, t, o in store.history
                                if rv > pos_rv and p == plural and
                                (ns is None or o["metadata"].get("namespace", "") == ns)]
                    if pos_rv < store.compacted_rv:
                        events = None
                    else:
                        events = collect()
                        if not events:
                            store.lock.wait(0.2)
                            events = None if pos_rv < store.compacted_rv else collect()
                        if events is not None and store.history:
                            pos_rv = max(pos_rv, store.history[-1][0])
                if events is None:
                    send({"type": "ERROR", "object": status_obj(410, "Expired",
                                                                "too old resource version")})
                    break
                for rv, t, o in events:
                    if lsel(o["metadata"].get("labels")) and fsel(o):
                        send({"type": t, "object": o})
                if bookmarks and time.monotonic() >= next_bookmark:
                    send({"type": "BOOKMARK", "object": {
                        "kind": RESOURCES[next(k for k in RESOURCES if k[2] == plural)][0],
                        "apiVersion": "v1", "metadata": {"resourceVersion": str(pos_rv)}}})
                    next_bookmark = time.monotonic() + sim.args.bookmark_s
            self.end_chunks()
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            self.close_connection = True
        finally:
            sim.counters["watches_open"] -= 1

    def end_chunks(self):
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass
        self.close_connection = True


class Counters(dict):
    def __missing__(self, key):
        return 0


class Sim:
    def __init__(self, args):
        self.args = args
        self.store = Store(history=args.history)
        self.tokens = set(args.token or [])
        self.fail_next = 0
        self.delay_ms = 0
        self.counters = Counters()
        self.scale_log = []
        adopted = {}
        if args.state and os.path.exists(args.state):
            with open(args.state) as f:
                adopted = self.store.load(json.load(f))
        else:
            for n in json.loads(args.nodes):
                self.store.create("nodes", {
                    "metadata": {"name": n["name"], "labels": {
                        "nvidia.com/gpu.count": str(n.get("gpus", 1)),
                        "nvidia.com/gpu.replicas": str(n.get("replicas", 1)),
                        "nvidia.com/gpu.product": n.get("product", "NVIDIA-A100-SXM4-80GB")}},
                    "status": {"allocatable": {"nvidia.com/gpu": str(
                        n.get("gpus", 1) * n.get("replicas", 1)), "cpu": "32",
                        "memory": "256Gi"}, "capacity": {"nvidia.com/gpu": str(
                            n.get("gpus", 1) * n.get("replicas", 1))}}}, "Node", "v1")
        self.cluster = Cluster(self.store, args)
        self.cluster.adopted = adopted


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--token", action="append", help="accepted bearer token (repeatable)")
    ap.add_argument("--nodes", default='[{"name": "gpu-node-1", "gpus": 1, "replicas": 4}]')
    ap.add_argument("--model-sim", default=os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        "build", "thaw-model-sim"))
    ap.add_argument("--load-ms", type=int, default=500)
    ap.add_argument("--kubelet-period-ms", type=int, default=1000)
    ap.add_argument("--tick-ms", type=int, default=50)
    ap.add_argument("--bookmark-s", type=float, default=5)
    ap.add_argument("--history", type=int, default=20000)
    ap.add_argument("--state")
    ap.add_argument("--pod-subnet", type=int, default=0,
                    help="pod IPs are 127.N.x.y (default: derived from the pid)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    if not 1 <= args.pod_subnet <= 254:
        args.pod_subnet = 2 + os.getpid() % 250
    sim = Sim(args)
    srv = Server((args.host, args.port), Handler)
    srv.sim, srv.sim_args = sim, args
    if args.cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.cert, args.key)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    port = srv.server_address[1]
    sim.cluster.start()

    def stop(signum, _frame):
        # SIGTERM with --state: a restart; pods (their processes) keep running
        # and are adopted by the next run. SIGINT, or no --state: stop them.
        keep = bool(args.state) and signum == signal.SIGTERM
        if args.state:
            with open(args.state + ".tmp", "w") as f:
                json.dump(sim.store.dump(sim.cluster.pids() if keep else {}), f)
            os.replace(args.state + ".tmp", args.state)
        sim.cluster.shutdown(keep_pods=keep)
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(port))
        os.replace(args.port_file + ".tmp", args.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    main()
