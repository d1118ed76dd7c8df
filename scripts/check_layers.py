#!/usr/bin/python3
"""Checks that thaw's sources include only their own layer or layers below.

Each module (a .c file and its header share the name) belongs to one layer;
an #include of a module of a higher layer is an upward call and fails the
check. Pure decision modules must also include neither libevent nor the
clock (time comes in as an argument).

KNOWN lists the upward includes that remain while the restructuring goes on,
each with what removes it. The check fails on any other upward include, and
also when a KNOWN entry no longer occurs (so the list only shrinks).

Usage: scripts/check_layers.py [ROOT]   (exit 0: clean, 1: violations)
"""
import pathlib
import re
import sys

LAYERS = [
    ("base", {"clock", "buf", "strmap", "list", "log", "jsonpos", "jsonscan", "metrics", "tier", "netaddr"}),
    ("config", {"config"}),
    ("http", {"http", "conn", "upstream", "probe"}),
    ("k8s", {"k8s/auth", "k8s/client", "k8s/events", "k8s/execcred", "k8s/informer",
             "k8s/lease", "k8s/objects", "k8s/peers"}),
    ("core", {"request", "model", "router", "queue"}),
    ("scale", {"autoscaler", "warmpool", "procplan", "scaler", "scale_driver"}),
    ("backends", {"backend", "backend_static", "backend_process", "backend_k8s",
                  "backend_k8s_replicas", "backend_k8s_scale", "backend_k8s_ha",
                  "backend_k8s_status", "k8s/model_spec"}),
    ("proxy", {"proxy"}),
    ("admin", {"admin"}),
    ("top", {"server", "reload", "main"}),
]
# Layers that sit side by side: neither may include the other.
SIDE_BY_SIDE = {frozenset({"http", "k8s"})}

PURE = {"queue", "router", "autoscaler", "warmpool", "procplan", "k8s/objects"}

# (includer module, included module): what removes it.
KNOWN = {
    ("conn", "server"): "the context split: conn takes limits and counters, not struct server",
    ("conn", "request"): "conn carries an opaque request for its handler",
    ("upstream", "server"): "the context split",
    ("upstream", "request"): "upstream carries an opaque request for its handler",
    ("upstream", "model"): "endpoints (address, slots, pool) as an http-layer type",
    ("proxy", "server"): "the context split",
    ("admin", "server"): "the context split",
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"thaw/([^"]+)\.h"', re.M)
SYSTEM = re.compile(r'^\s*#\s*include\s+[<"](event2/[^>"]+|thaw/clock\.h)[>"]', re.M)


def module_of(path, root):
    rel = path.relative_to(root).as_posix()
    for prefix in ("include/thaw/", "src/"):
        if rel.startswith(prefix):
            return rel[len(prefix):].rsplit(".", 1)[0]
    return None


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    rank = {m: i for i, (_, mods) in enumerate(LAYERS) for m in mods}
    layer_name = {m: name for name, mods in LAYERS for m in mods}
    files = sorted(list((root / "src").rglob("*.c")) + list((root / "include/thaw").rglob("*.h")))
    problems, seen_known = [], set()
    for f in files:
        mod = module_of(f, root)
        if mod not in rank:
            problems.append(f"{f.relative_to(root)}: module '{mod}' has no layer in {__file__}")
            continue
        text = f.read_text(errors="replace")
        for inc in INCLUDE.findall(text):
            if inc == mod or inc not in rank:
                if inc not in rank:
                    problems.append(f"{f.relative_to(root)}: includes '{inc}', which has no layer")
                continue
            a, b = layer_name[mod], layer_name[inc]
            upward = rank[inc] > rank[mod] and b != a
            sideways = frozenset({a, b}) in SIDE_BY_SIDE
            if not (upward or sideways):
                continue
            if (mod, inc) in KNOWN:
                seen_known.add((mod, inc))
                continue
            problems.append(f"{f.relative_to(root)}: {a} module '{mod}' includes "
                            f"{b} module '{inc}' ({'upward' if upward else 'sideways'})")
        if mod in PURE:
            for bad in SYSTEM.findall(text):
                problems.append(f"{f.relative_to(root)}: pure module '{mod}' includes {bad}")
    for pair in sorted(set(KNOWN) - seen_known):
        problems.append(f"{pair[0]} -> {pair[1]} is listed as known but no longer occurs: "
                        "remove it from KNOWN")
    for p in problems:
        print(p)
    print(f"layers: {len(files)} files checked, {len(problems)} problem(s), "
          f"{len(seen_known)} known upward include(s) left")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
