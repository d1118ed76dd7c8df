#!/usr/bin/python3
"""Checks that thaw's sources include only their own layer or layers below.

Each source file belongs to the layer named by its folder under src/ (the
files directly in src/ are the top); a header in include/thaw/ belongs to the
layer of the source that implements it (same name). An #include of a header
of a higher layer is an upward call and fails the check. Pure decision modules must also include neither libevent nor the
clock (time comes in as an argument).

KNOWN may list upward includes allowed while a restructuring is under way;
it is empty, and the check fails on any upward include not in it, and when
a KNOWN entry no longer occurs (so the list only shrinks).

Usage: scripts/check_layers.py [ROOT]   (exit 0: clean, 1: violations)
"""
import pathlib
import re
import sys

# Layers, lowest first. A source file's layer is its folder under src/
# (src/*.c is "top"); a header's layer is that of the source with its name.
LAYERS = ["base", "config", "http", "k8s", "core", "scale", "backends", "proxy", "admin", "top"]
# Headers with no source of the same name.
HEADER_ONLY = {"list": "base", "backend": "backends"}
# Layers that sit side by side: neither may include the other.
SIDE_BY_SIDE = {frozenset({"http", "k8s"})}

PURE = {"queue", "tenant", "router", "revsplit", "rollout", "autoscaler", "warmpool", "procplan",
        "forecast", "k8s/objects"}

# (includer module, included module): upward includes allowed while a
# restructuring is under way, each with what removes it. Empty: none is.
KNOWN = {}

INCLUDE = re.compile(r'^\s*#\s*include\s+"thaw/([^"]+)\.h"', re.M)
SYSTEM = re.compile(r'^\s*#\s*include\s+[<"](event2/[^>"]+|thaw/clock\.h)[>"]', re.M)


def layer_of_source(path, root):
    parts = path.relative_to(root / "src").parts
    return "top" if len(parts) == 1 else parts[0]


def module_of(path, root):
    """A header's module is its path under include/thaw/ without .h; a
    source's module is the header it implements (same name), else its stem."""
    rel = path.relative_to(root).as_posix()
    if rel.startswith("include/thaw/"):
        return rel[len("include/thaw/"):-2]
    return None


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    rank = {name: i for i, name in enumerate(LAYERS)}
    sources = sorted((root / "src").rglob("*.c")) + sorted((root / "src").rglob("*.h"))
    headers = sorted((root / "include/thaw").rglob("*.h"))
    # Which layer each header (module) belongs to.
    by_stem = {}
    for f in sources:
        by_stem.setdefault(f.stem, []).append(f)
    layer_name, problems, seen_known = dict(HEADER_ONLY), [], set()
    for h in headers:
        mod = module_of(h, root)
        if mod in layer_name:
            continue
        # include/thaw/k8s/x.h pairs with a src/**/k8s/x.c; x.h with src/**/x.c.
        cands = [f for f in by_stem.get(pathlib.PurePath(mod).name, [])
                 if "/" not in mod or f.parent.name == pathlib.PurePath(mod).parent.name]
        if len(cands) != 1:
            problems.append(f"{h.relative_to(root)}: no single source implements it ({len(cands)} found)")
            continue
        layer_name[mod] = layer_of_source(cands[0], root)
    for la in set(layer_name.values()) | {layer_of_source(f, root) for f in sources}:
        if la not in rank:
            problems.append(f"layer '{la}' is not in LAYERS in {__file__}")
    if problems:
        for p in problems:
            print(p)
        return 1
    for f in headers + sources:
        if f.suffix == ".h" and f.is_relative_to(root / "include"):
            mod = module_of(f, root)
            a = layer_name[mod]
        else:
            mod = f.stem
            if f.parent.name == "k8s" and f"k8s/{f.stem}" in layer_name:
                mod = f"k8s/{f.stem}"
            a = layer_of_source(f, root)
        text = f.read_text(errors="replace")
        for inc in INCLUDE.findall(text):
            if inc not in layer_name:
                problems.append(f"{f.relative_to(root)}: includes 'thaw/{inc}.h', which has no layer")
                continue
            b = layer_name[inc]
            if inc == mod or a == b:
                continue
            upward = rank[b] > rank[a]
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
    print(f"layers: {len(headers) + len(sources)} files checked, {len(problems)} problem(s), "
          f"{len(seen_known)} known upward include(s) left")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
