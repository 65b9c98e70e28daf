#!/usr/bin/env python3
"""Checks that stoker-core's `use` lines follow ARCHITECTURE.md's module map.

The map's table lists the floors of stoker-core from the bottom (`error`, `dtype`, `rng`) up to
`loader` and `testing`: its first column names each floor's top-level modules. A module may import
only modules on its own floor or below it (listed above it in the table), plus the exceptions the
map names: `memory::physical_memory` and the handle types of `cuda::device`. An import of a higher
floor is an arrow up.

A circle is a cycle of imports between modules, where a module is one `.rs` file
(`source/tar/mod.rs` is `source::tar`). Imports between a module and its own ancestors or
descendants do not count towards circles: a parent declares and re-exports its children, and a
child may use its parent's trait, so that pair is one unit by construction.

What counts as an import: every path beginning `crate::` or `super::` (in `use` trees, grouped
ones expanded, and written inline in code), resolved to the deepest module it names. Comments,
strings and `#[cfg(test)]` code are skipped (an inline `#[cfg(test)] mod tests { ... }` block, a
file declared by `#[cfg(test)] mod x;`, an item under `#[cfg(test)]`): tests may reach anywhere
they need to, and they are not part of the layering a user's build has. `lib.rs` is the crate's
facade (module declarations and re-exports) and is not checked.

Exit status 1, naming file, line and arrow (the first line of each offending pair of modules),
on any arrow up, circle or module missing from the map. `LAYOUT_EDGES=1` also prints the
top-level import graph.
"""

import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "crates", "stoker-core", "src")
ARCH = os.path.join(ROOT, "ARCHITECTURE.md")

# The map's own exceptions ("plus `memory::physical_memory` and the plain handle types of
# `cuda::device`"): these may be imported from any floor.
EXEMPT = (("memory", "physical_memory"), ("cuda", "device"))


def floors():
    """The floor of every top-level module, from the map's table (0 = the bottom floor)."""
    text = open(ARCH, encoding="utf-8").read()
    start = text.index("## Module map of `stoker-core`")
    floor_of = {}
    rows = 0
    in_table = False
    for line in text[start:].splitlines()[1:]:
        if not line.startswith("|"):
            if in_table:
                break
            continue
        in_table = True
        first = line.split("|")[1].strip()
        names = re.findall(r"`([a-z_][a-z0-9_]*)`", first)
        if not names:
            continue  # the header and its rule
        for name in names:
            floor_of[name] = rows
        rows += 1
    return floor_of


def strip(text):
    """The code with comments and string/char literals blanked (newlines kept for line numbers)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
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
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and not re.match(r"\w", text[i - 1:i] or " "):
            m = re.match(r'r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + len(m.group(0)))
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i:j + 1]))
            i = j + 1
        elif c == "'":
            # a char literal ('a', '\n', '\u{..}'), not a lifetime ('a)
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(code, open_at):
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


def drop_cfg_test(code):
    """Blanks every item under `#[cfg(test)]`; returns the code and the `mod x;` files it declared."""
    test_files = []
    for m in reversed(list(re.finditer(r"#\[cfg\(test\)\]", code))):
        rest = code[m.end():]
        decl = re.match(r"\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", rest)
        if decl:
            test_files.append(decl.group(1))
            end = m.end() + decl.end()
        else:
            semi = rest.find(";")
            brace = rest.find("{")
            if brace >= 0 and (semi < 0 or brace < semi):
                end = matching_brace(code, m.end() + brace) + 1
            else:
                end = m.end() + semi + 1
        code = code[:m.start()] + re.sub(r"[^\n]", " ", code[m.start():end]) + code[end:]
    return code, test_files


def expand_use(tree):
    """`a::{b, c::{d as e, f::*}}` -> [[a, b], [a, c, d], [a, c, f]]."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)  # aliases name nothing new
    tree = re.sub(r"\s+", "", tree)

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += ch == "{"
            depth -= ch == "}"
            cur += ch
        if cur:
            parts.append(cur)
        return parts

    def go(prefix, s):
        brace = s.find("{")
        if brace < 0:
            return [prefix + [x for x in s.split("::") if x and x != "*"]]
        head = [x for x in s[:brace].split("::") if x]
        inner = s[brace + 1:s.rindex("}")]
        result = []
        for part in split_top(inner):
            result.extend(go(prefix + head, part))
        return result

    return go([], tree)


def module_of(path_segs, modules):
    """The deepest known module a crate-absolute path names."""
    for k in range(len(path_segs), 0, -1):
        if tuple(path_segs[:k]) in modules:
            return tuple(path_segs[:k])
    return None


def resolve(segs, here):
    """Crate-absolute segments of a `crate::`/`super::`/`self::` path written in module `here`."""
    if segs[0] == "crate":
        return segs[1:]
    base = list(here)
    if segs[0] == "self":
        return base + segs[1:]
    i = 0
    while i < len(segs) and segs[i] == "super":
        base = base[:-1]
        i += 1
    return base + segs[i:]


def strongly_connected(graph):
    """Tarjan's algorithm: the components of more than one node, each sorted."""
    index, low, stack, on, sccs = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
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
                sccs.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sccs


def main():
    floor_of = floors()
    files = {}
    for dirpath, _, names in os.walk(SRC):
        for name in names:
            if name.endswith(".rs"):
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, SRC)
                parts = rel[:-3].split(os.sep)
                if parts[-1] == "mod":
                    parts = parts[:-1]
                if parts == ["lib"] or parts == ["main"]:
                    parts = []
                files[tuple(parts)] = rel
    modules = set(files)

    # test-only files, and their descendants
    test_only = set()
    codes = {}
    for mod, rel in files.items():
        raw = open(os.path.join(SRC, rel), encoding="utf-8").read()
        code, test_files = drop_cfg_test(strip(raw))
        codes[mod] = code
        for t in test_files:
            test_only.add(mod + (t,))

    def is_test(mod):
        return any(mod[:k] in test_only for k in range(1, len(mod) + 1))

    missing, arrows = [], {}  # arrows: (from, to) -> the first offending line's report
    edges = {}  # (from, to) -> first (file, line), between files
    top_edges = {}  # the same between top-level modules, the map's exceptions left out
    for mod, rel in sorted(files.items()):
        if mod == () or is_test(mod):
            continue
        top = mod[0]
        if top not in floor_of:
            missing.append(f"{rel}: module `{top}` is not in ARCHITECTURE.md's module map")
            continue
        code = codes[mod]
        found = []  # (line, segs)
        for m in re.finditer(r"\buse\s+((?:crate|super|self)\b[^;]*);", code):
            line = code.count("\n", 0, m.start()) + 1
            for segs in expand_use(m.group(1)):
                found.append((line, segs))
        uses_blank = re.sub(r"\buse\s+[^;]*;", lambda x: re.sub(r"[^\n]", " ", x.group(0)), code)
        for m in re.finditer(r"(?<![\w:])((?:crate|super)(?:::\w+)+)", uses_blank):
            line = code.count("\n", 0, m.start()) + 1
            found.append((line, m.group(1).split("::")))
        for line, segs in found:
            path = resolve(segs, mod)
            target = module_of(path, modules)
            if target is None or target == () or target == mod:
                continue
            exempt = any(tuple(path[:len(e)]) == e for e in EXEMPT)
            edges.setdefault((mod, target), (rel, line))
            ttop = target[0]
            if ttop != top and not exempt:
                top_edges.setdefault((top, ttop), (rel, line))
            if ttop not in floor_of or exempt:
                continue
            if floor_of[ttop] > floor_of[top]:
                arrows.setdefault((mod, target), (
                    f"{rel}:{line}: arrow up: {'::'.join(mod)} -> {'::'.join(target)} "
                    f"(`{ttop}` is on a higher floor than `{top}`: listed after it in the map)"))

    # circles: strongly connected components of the file-module graph (ancestor pairs left out)
    # and of the top-level modules' graph (the map's exceptions left out)
    files_graph = {}
    for (a, b) in edges:
        if a[:len(b)] == b or b[:len(a)] == a:
            continue
        files_graph.setdefault(a, set()).add(b)
    top_graph = {}
    for (a, b) in top_edges:
        top_graph.setdefault((a,), set()).add((b,))
    top_where = {((a,), (b,)): v for (a, b), v in top_edges.items()}
    circles = []
    for graph, where in ((files_graph, edges), (top_graph, top_where)):
        for comp in strongly_connected(graph):
            members = set(comp)
            lines = [f"    {rel}:{line}: {'::'.join(a)} -> {'::'.join(b)}"
                     for (a, b), (rel, line) in sorted(where.items())
                     if a in members and b in members and b in graph.get(a, ())]
            circles.append("circle: " + ", ".join("::".join(m) for m in comp) + "\n"
                           + "\n".join(lines))

    for report in missing + [arrows[k] for k in sorted(arrows)] + circles:
        print(report)
    if os.environ.get("LAYOUT_EDGES"):  # the whole top-level graph, to plan a change of the map
        for (a, b), (rel, line) in sorted(top_edges.items()):
            print(f"edge {a} -> {b} ({rel}:{line})")
    checked = [m for m in files if m != () and not is_test(m)]
    summary = (f"layout: {len({m[0] for m in checked})} modules ({len(checked)} files), "
               f"{len(arrows)} arrows up, {len(circles)} circles")
    if missing:
        summary += f", {len(missing)} files in modules missing from the map"
    print(summary)
    return 1 if missing or arrows or circles else 0


if __name__ == "__main__":
    sys.exit(main())
