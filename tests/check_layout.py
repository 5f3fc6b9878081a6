#!/usr/bin/env python3
"""Layout rules the code keeps (run by tests/run-all.sh):

1. No import circles between files of a crate: file A naming `crate::x` (a `use` or a path)
   that resolves to file B, and B naming back to A, directly or through others. A child
   module using its parent's mod.rs does not count (that is how a folder exposes its API).
2. No Rust file over 900 lines outside its test module (`#[cfg(test)] mod tests`) and test
   files (`tests.rs`, `*_tests.rs`, a test module's files under a `tests/` folder of `src/`,
   crates' `tests/` and `benches/`), in every crate's `src/`, the test control plane's
   `tests/src/` included.
3. The kubelet's top-level modules sit in layers (LAYERS below, bottom first) and a module
   imports only modules of its own layer or of layers below it. Every top-level module is in
   the table, so a new one has to be placed. Within a layer imports are allowed, but the
   top-level modules as a whole (each folder collapsed to one node, every layer together)
   must not import in a circle: the folder-level cycle check. Test code (as in rule 1) is
   not counted; `lib.rs` and `main.rs` are the crate's roots and may name anything.
   Between two subsystems an import is a decision: each allowed one is listed in
   ALLOWED_EDGES with why, and a subsystem importing another one not listed fails (a listed
   one that no longer exists is reported, to be dropped from the table).
4. Errors are typed: the count of `Result<T, String>` in each crate's non-test code (as in
   rule 2) may not grow past its ceiling in STRING_ERRORS. Lower the ceiling when you remove
   some; a new one is a new error enum instead (`thiserror`).
5. A reader can hold a function: no non-test function (test code as in rule 2, and functions
   marked `#[test]` or `#[cfg(test)]`) in a production crate's `src/` is over MAX_FN_LINES
   lines, counted from its `fn` line to its closing brace (comments, strings, chars and raw
   strings skipped by `code_mask`). ALLOW names the exceptions, generated or table-like code,
   each with its reason; TEMPORARY the ones being split now, each with its owner. The test
   harness (`tests/src`, only ever a dev-dependency) is test code here. `--self-test` checks
   the brace matcher on a sample (main runs it first).

Prints each problem and exits 1 when there is one.
"""
import os
import re
import sys

MAX_LINES = 900
# Rule 4: the most `Result<T, String>` each crate's non-test code may hold (a ratchet).
STRING_ERRORS = {"kubelet/src": 45, "proxy/src": 7, "plumbing/src": 2, "cni/src": 1,
                 "probes/src": 6, "systemd/src": 0, "cri-proto/src": 0}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRATE_SRCS = ["kubelet/src", "proxy/src", "probes/src", "cri-proto/src", "cni/src",
              "systemd/src", "tests/src"]
# A test-only item: `#[cfg(test)]`, other attributes (`#[path]`), then `mod x;`, `mod x {`
# or `use …;`.
TEST_ITEM = re.compile(
    r"^[ \t]*#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([a-z]+\))?\s+)?(mod\s+\w+\s*[;{]|use\s[^;]*;)",
    re.M,
)
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


# The kubelet's layers, bottom first (see ARCHITECTURE.md). Upstream's pkg/kubelet is cut the
# same way: shared utilities, the OS and API edges, one package per subsystem, the pod
# lifecycle core, and the assembly on top.
LAYERS = {
    "kubelet/src": [
        # Base: small utilities every layer uses; no policy, no subsystem.
        ("base", ["atomic_file", "clock", "events", "fs_at", "metrics", "node_settings",
                  "podspec", "settings"]),
        # Edges: traits (with fakes) over the CRI runtime, cgroups, the host's facts, the
        # apiserver (client, informers, object caches, the event sink).
        ("edges", ["cm", "host", "objects", "runtime"]),
        # Subsystems: each owns one concern and its settings and exposes it from its mod.rs.
        ("subsystems", ["allocation", "certs", "devices", "eviction", "images", "logs", "network",
                        "node", "oom", "pleg", "pluginmanager", "pod_dirs", "podresources", "probing",
                        "server", "shutdown", "spec", "stats", "userns",
                        "volume"]),
        # Core: the pod lifecycle. Sources and admission -> sync loop -> one worker per pod
        # -> status (manager and apiserver writer).
        ("core", ["pod", "pod_worker", "status", "sync_loop"]),
        # App: the command line and config file, and the assembly that starts everything.
        ("app", ["app", "config", "proxy_role", "systemd"]),
    ],
}

# Rule 3: the imports allowed between two modules of the subsystems layer, each with why.
# Shared helpers belong in base (`fs_at`, `node_settings`, `podspec`), not behind an edge.
ALLOWED_EDGES = {
    "kubelet/src": {
        ("eviction", "stats"): "eviction signals and ranking read the stats snapshot",
        ("images", "stats"): "image GC reads the image filesystem's usage from stats",
        ("node", "devices"): "node status reports device plugin capacity and allocatable",
        ("node", "eviction"): "node status carries the pressure conditions",
        ("node", "pleg"): "the Ready condition includes PLEG health",
        ("node", "shutdown"): "the Ready condition says when the node is shutting down",
        ("pod_dirs", "spec"): "pod files are the host side of the CRI config (etc-hosts, "
                              "subPaths, termination logs)",
        ("pod_dirs", "volume"): "subPath bind mounts go through the volume's Binder",
        ("podresources", "devices"): "the pod resources API reports device and DRA allocations",
        ("server", "certs"): "the serving certificate's key pair check",
        ("server", "logs"): "container log files are served in the rotation's naming",
        ("server", "pleg"): "/healthz includes PLEG health",
        ("server", "stats"): "/stats/summary and /metrics/resource serve the stats snapshot",
        ("spec", "devices"): "a container's CRI config carries the device plugins' run "
                             "options (envs, mounts, device nodes, annotations, CDI names)",
        ("volume", "pluginmanager"): "the CSI driver registry is a plugin manager handler",
    },
}


def check_layers(src, layers):
    """Rule 3 over one crate: layer order and no folder-level circle."""
    problems = []
    level = {}
    for i, (_, names) in enumerate(layers):
        for n in names:
            level[n] = i
    files, edges = file_edges(src)
    tops = {m[0] for m in files if m}
    for n in sorted(tops - set(level)):
        problems.append(f"{src}/{n}: top-level module missing from the layer table (LAYERS)")
    for n in sorted(set(level) - tops):
        problems.append(f"{src}: layer table names {n}, which does not exist")
    graph = {n: set() for n in tops}
    allowed = ALLOWED_EDGES.get(os.path.relpath(src, ROOT), {})
    subsystems = set(dict(layers).get("subsystems", []))
    seen = set()
    for mod, targets in edges.items():
        if not mod:
            continue  # lib.rs / main.rs
        for target in targets:
            if not target or target[0] == mod[0]:
                continue
            a, b = mod[0], target[0]
            graph[a].add(b)
            if a in subsystems and b in subsystems:
                seen.add((a, b))
                if (a, b) not in allowed:
                    problems.append(
                        f"subsystem edge: {os.path.relpath(files[mod], ROOT)} imports "
                        f"{os.path.relpath(files[target], ROOT)}: {a} -> {b} is not in "
                        f"ALLOWED_EDGES (list it with why, or move the shared part to base)"
                    )
            if a in level and b in level and level[b] > level[a]:
                problems.append(
                    f"layer: {os.path.relpath(files[mod], ROOT)} ({layers[level[a]][0]}) imports "
                    f"{os.path.relpath(files[target], ROOT)} ({layers[level[b]][0]}), a layer above it"
                )
    for a, b in sorted(set(allowed) - seen):
        print(f"check_layout: ALLOWED_EDGES lists {a} -> {b}, which no longer exists: drop it")
    for comp in sccs(graph):
        problems.append("folder-level import circle: " + " <-> ".join(sorted(comp)))
    return problems


def is_test_file(path, src):
    """`tests.rs`, `*_tests.rs`, and anything under a `tests/` folder of the crate's source
    (a test module's own files: `foo/tests/wire.rs`)."""
    base = os.path.basename(path)
    under_tests = "tests" in os.path.relpath(path, src).split(os.sep)[:-1]
    return base == "tests.rs" or base.endswith("_tests.rs") or under_tests


def non_test_text(text):
    """The text without its test-only items: `#[cfg(test)] mod x;` declarations and `use`s
    are dropped, an inline `#[cfg(test)] mod x { … }` up to its closing brace."""
    out, pos = [], 0
    for m in TEST_ITEM.finditer(text):
        if m.start() < pos:
            continue
        out.append(text[pos : m.start()])
        pos = m.end()
        if m.group(1).endswith("{"):
            depth = 1
            while pos < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[pos], 0)
                pos += 1
    out.append(text[pos:])
    return "".join(out)


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


def file_edges(src):
    """The crate's non-test files by module path, and which files each one names."""
    files = {}
    for path in rust_files(src):
        if "/bin/" in path or is_test_file(path, src):
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
        # Whole `use crate::…;` statements first (a brace list may span lines).
        for m in USE_STMT.finditer(text):
            for p in expand_use(m.group(1)):
                paths.append([x for x in p.split("::") if x and x != "self"])
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
    return files, edges


def sccs(edges):
    """Strongly connected groups of more than one node (Tarjan)."""
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
    return out


def string_errors(text):
    """How many `Result<T, String>` the text names: a `Result<` with its type arguments read
    to the matching `>` (nested generics and `->` skipped), the second one `String`."""
    count = 0
    for m in re.finditer(r"\bResult<", text):
        i, depth, args, cur = m.end(), 1, [], ""
        while i < len(text) and depth:
            ch = text[i]
            if ch == "<":
                depth += 1
            elif ch == ">" and text[i - 1] != "-":
                depth -= 1
            if depth == 1 and ch == ",":
                args.append(cur)
                cur = ""
            elif depth:
                cur += ch
            i += 1
        args.append(cur)
        count += len(args) == 2 and args[1].strip() == "String"
    return count


def check_string_errors(rel):
    src = os.path.join(ROOT, rel)
    n = sum(
        string_errors(non_test_text(open(p, encoding="utf-8").read()))
        for p in rust_files(src)
        if not is_test_file(p, src)
    )
    ceiling = STRING_ERRORS[rel]
    if n > ceiling:
        return [f"{rel}: {n} `Result<_, String>` outside tests (ceiling {ceiling}): use a typed error"]
    if n < ceiling:
        print(f"check_layout: {rel} holds {n} `Result<_, String>`, under its ceiling {ceiling}: lower it")
    return []


def check_crate(src):
    problems = []
    files, edges = file_edges(src)
    for comp in sccs(edges):
        names = sorted(os.path.relpath(files[m], ROOT) for m in comp)
        problems.append("import circle: " + " <-> ".join(names))
    for path in sorted(rust_files(src)):
        if is_test_file(path, src):
            continue
        n = non_test_text(open(path, encoding="utf-8").read()).count("\n")
        if n > MAX_LINES:
            problems.append(f"{os.path.relpath(path, ROOT)}: {n} lines outside tests (max {MAX_LINES})")
    return problems


# Rule 5: no non-test function over MAX_FN_LINES lines, counted from its `fn` line to its
# closing brace. Each exception names its reason: generated or table-like code only.
MAX_FN_LINES = 150
FN_CRATE_SRCS = [s for s in CRATE_SRCS if s != "tests/src"] + ["plumbing/src"]
ALLOW = {}
# Functions being split right now by their owners (issue 39); the lead empties this list at
# merge. Key -> owner.
TEMPORARY = {
}


def code_mask(text):
    """The text with every comment, string and char literal blanked to spaces (newlines
    kept), so braces and `fn` are only the code's own. Handles nested block comments, raw
    strings (`r#"…"#`, `br"…"`), escapes, and a char literal against a lifetime (`'{'` /
    `'a`)."""
    out, i, n = list(text), 0, len(text)

    def blank(a, b):
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif c in "rbc" and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'[bc]?r(#*)"', text[i : i + 300])
            if m:
                close = '"' + m.group(1)
                j = text.find(close, i + m.end())
                j = n if j < 0 else j + len(close)
                blank(i, j)
                i = j
            elif c in "bc" and text.startswith('"', i + 1):
                i += 1  # b"…" / c"…": the string branch blanks it
            else:
                i += 1
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            blank(i, j + 1)
            i = j + 1
        elif c == "'":
            if text.startswith("\\", i + 1):
                j = text.find("'", i + 3)
                j = n if j < 0 else j + 1
            elif i + 2 < n and text[i + 2] == "'":
                j = i + 3
            else:
                i += 1  # a lifetime or label
                continue
            blank(i, j)
            i = j
        else:
            i += 1
    return "".join(out)


FN_ITEM = re.compile(r"\bfn\s+(r#)?([A-Za-z_]\w*)")
TEST_ATTR = re.compile(r"#\[(?:cfg\(test\)|test|tokio::test\b[^\]]*)\]")


def close_of(code, i):
    """The index of the brace closing the one at `i`."""
    depth = 0
    for j in range(i, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if not depth:
                return j
    return len(code) - 1


def test_spans(code):
    """Character spans of test-only items: `#[cfg(test)] mod x { … }` (as rule 2)."""
    spans = []
    for m in TEST_ITEM.finditer(code):
        if m.group(1).endswith("{"):
            spans.append((m.start(), close_of(code, m.end() - 1)))
    return spans


def test_marked(code, at):
    """Whether the item at `at` carries `#[test]` or `#[cfg(test)]`: its attributes are the
    lines just above it (doc comments are blank in the mask)."""
    lines = code[: code.rfind("\n", 0, at) + 1].split("\n")[:-1]
    for line in reversed(lines[-20:]):
        line = line.strip()
        if line and not line.startswith("#["):
            return False
        if TEST_ATTR.match(line):
            return True
    return False


def functions(text):
    """(name, first line, line count) of each function with a body in the text, test items
    left out: those in a `#[cfg(test)]` module and those marked `#[test]`/`#[cfg(test)]`."""
    code = code_mask(text)
    spans = test_spans(code)
    out = []
    for m in FN_ITEM.finditer(code):
        if any(a <= m.start() <= b for a, b in spans):
            continue
        if test_marked(code, m.start()):
            continue
        # The body: the first `{` outside parentheses and brackets; a `;` first means none.
        depth, j = 0, m.end()
        while j < len(code):
            ch = code[j]
            if ch in "([":
                depth += 1
            elif ch in ")]":
                depth -= 1
            elif depth == 0 and ch in "{;":
                break
            j += 1
        if j >= len(code) or code[j] == ";":
            continue
        end = close_of(code, j)
        first = code.count("\n", 0, m.start()) + 1
        last = code.count("\n", 0, end) + 1
        out.append((m.group(2), first, last - first + 1))
    return out


def check_functions(src, over):
    """Rule 5 over one crate; each function over the limit goes into `over` (key -> lines)."""
    problems, full = [], os.path.join(ROOT, src)
    for path in sorted(rust_files(full)):
        if is_test_file(path, full):
            continue
        rel = os.path.relpath(path, ROOT)
        for name, line, n in functions(open(path, encoding="utf-8").read()):
            key = f"{rel}::{name}"
            if n <= MAX_FN_LINES:
                continue
            over[key] = n
            if key not in ALLOW and key not in TEMPORARY:
                problems.append(f"{rel}:{line}: fn {name} is {n} lines (max {MAX_FN_LINES}): split it")
    return problems


def check_exceptions(over):
    """An ALLOW entry no function needs any more fails (the list stays short); a TEMPORARY
    one is only reported (its owner's split may have landed)."""
    problems = []
    for key in sorted(ALLOW):
        if key not in over:
            problems.append(f"ALLOW names {key}, which is not over {MAX_FN_LINES} lines: remove it")
    for key in sorted(TEMPORARY):
        if key not in over:
            print(f"check_layout: TEMPORARY names {key} ({TEMPORARY[key]}), not over {MAX_FN_LINES} lines now: remove it")
    return problems


SELF_TEST = r'''
fn one() -> &'static str {
    let c = '{';
    let e = '\'';
    let s = "}} \" }";
    // }
    /* } /* nested } */ } */
    let r = r#"a "} raw"#;
    let b = br"}";
    loop { 'outer: loop { break 'outer; } break; }
    s
}
trait T { fn decl(&self); fn with_body<'a>(&'a self) -> [u8; 2] { [0; 2] } }
#[test]
fn a_test() {}
#[cfg(test)]
mod tests {
    fn helper() {}
}
fn last() {
}
'''


def self_test():
    """The matcher on a sample: every brace in a literal or comment skipped, test items and
    bodiless declarations left out."""
    got = functions(SELF_TEST)
    want = [("one", 2, 11), ("with_body", 13, 1), ("last", 20, 2)]
    if got != want:
        return [f"self-test: functions() found {got}, expected {want}"]
    return []


def main():
    problems = []
    for src in CRATE_SRCS:
        full = os.path.join(ROOT, src)
        if os.path.isdir(full):
            problems += check_crate(full)
    for src, layers in LAYERS.items():
        problems += check_layers(os.path.join(ROOT, src), layers)
    for rel in STRING_ERRORS:
        problems += check_string_errors(rel)
    problems += self_test()
    over = {}
    for src in FN_CRATE_SRCS:
        problems += check_functions(src, over)
    problems += check_exceptions(over)
    for p in problems:
        print("check_layout:", p)
    if problems:
        return 1
    print("check_layout: no import circles, no file over", MAX_LINES, "lines outside tests,")
    print("check_layout: the kubelet's layers hold and its top-level modules import in no circle")
    print("check_layout: every import between two subsystems is one ALLOWED_EDGES lists")
    print("check_layout: no crate holds more `Result<_, String>` than its ceiling")
    print("check_layout: no non-test function over", MAX_FN_LINES, "lines outside ALLOW and TEMPORARY")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        errs = self_test()
        print("\n".join(errs) or "check_layout: self-test passed")
        sys.exit(1 if errs else 0)
    sys.exit(main())
