#!/usr/bin/env python3
"""Layout rules the code keeps (run by tests/run-all.sh):

1. No import circles between files of a crate: file A naming `crate::x` (a `use` or a path)
   that resolves to file B, and B naming back to A, directly or through others. A child
   module using its parent's mod.rs does not count (that is how a folder exposes its API).
2. No Rust file over 900 lines outside its test module (`#[cfg(test)] mod tests`) and test
   files (`tests.rs`, `*_tests.rs`, crates' `tests/` and `benches/`), in every crate's `src/`,
   the test control plane's `tests/src/` included.

Prints each problem and exits 1 when there is one.
"""
import os
import re
import sys

MAX_LINES = 900
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRATE_SRCS = ["kubelet/src", "proxy/src", "probes/src", "cri-proto/src", "cni/src",
              "systemd/src", "tests/src"]
TEST_MOD = re.compile(r"^#\[cfg\(test\)\]\s*\n\s*(pub(\(crate\))? )?mod \w+\s*(;|\{)", re.M)
CRATE_PATH = re.compile(r"\bcrate((?:::\w+)+)")
USE_STMT = re.compile(r"\buse\s+crate::([^;]*);", re.S)


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ["a::b", "a::c::d", "a::c::e"] (no braces: [tree])."""
    # `x as y` renames: drop the rename (a bare "as" inside a name, as in `runtime_class`,
    # is part of the name).
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)
    i = tree.find("{")
    if i < 0:
        return [tree]
    prefix, inner = tree[:i], tree[i + 1 : tree.rfind("}")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        if p:
            out += [prefix + q for q in expand_use(p)]
    return out


def is_test_file(path):
    base = os.path.basename(path)
    return base == "tests.rs" or base.endswith("_tests.rs")


def non_test_text(text):
    m = TEST_MOD.search(text)
    return text[: m.start()] if m else text


def module_of(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def rust_files(src):
    for d, _, files in os.walk(src):
        for f in files:
            if f.endswith(".rs"):
                yield os.path.join(d, f)


def file_of(files, parts):
    """The deepest module file of ours along `parts`, or None."""
    best = None
    for n in range(1, len(parts) + 1):
        if tuple(parts[:n]) in files:
            best = tuple(parts[:n])
    return best


def check_crate(src):
    problems = []
    files = {}
    for path in rust_files(src):
        if "/bin/" in path or is_test_file(path):
            continue
        files[module_of(src, path)] = path
    edges = {m: set() for m in files}
    for mod, path in files.items():
        # Doc links count too: a module's docs naming another are a dependency a reader
        # follows. Only the test module is left out.
        text = non_test_text(open(path, encoding="utf-8").read())
        is_dir_module = os.path.basename(path) in ("mod.rs", "lib.rs", "main.rs")
        here = list(mod) if is_dir_module else list(mod[:-1])
        paths = []
        for m in re.finditer(r"\b(crate|super)::([A-Za-z_{][^;\s\]`)]*)", text):
            # `super` of module a::b is a, whether b is b.rs or b/mod.rs.
            base = [] if m.group(1) == "crate" else list(mod[:-1])
            for p in expand_use(m.group(2).rstrip(",")):
                paths.append(base + [x for x in p.split("::") if x and x != "self"])
        # `sub::...` naming a submodule this file declares.
        for sub in re.findall(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+(\w+)\s*;", text, re.M):
            if re.search(r"(?<![:\w])" + sub + r"::", text):
                paths.append(here + [sub])
        for parts in paths:
            target = file_of(files, parts)
            if target is None or target == mod or target == ():
                continue
            if mod[: len(target)] == target:
                continue  # a child using its parent's mod.rs
            edges[mod].add(target)
    # Strongly connected components (Tarjan).
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    for comp in out:
        names = sorted(os.path.relpath(files[m], ROOT) for m in comp)
        problems.append("import circle: " + " <-> ".join(names))
    for path in sorted(rust_files(src)):
        if is_test_file(path):
            continue
        n = non_test_text(open(path, encoding="utf-8").read()).count("\n")
        if n > MAX_LINES:
            problems.append(f"{os.path.relpath(path, ROOT)}: {n} lines outside tests (max {MAX_LINES})")
    return problems


def main():
    problems = []
    for src in CRATE_SRCS:
        full = os.path.join(ROOT, src)
        if os.path.isdir(full):
            problems += check_crate(full)
    for p in problems:
        print("check_layout:", p)
    if problems:
        return 1
    print("check_layout: no import circles, no file over", MAX_LINES, "lines outside tests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
