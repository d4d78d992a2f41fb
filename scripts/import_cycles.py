#!/usr/bin/env python3
"""Lists the import circles between the source files of each crate.

A file imports another when it names a path into it: `use crate::a::b`, `crate::a::b::f(..)`,
`super::x` or `self::x` (in a `mod.rs` or `lib.rs`), resolved to the deepest module file that
exists (`src/a/b.rs`, `src/a/b/mod.rs`, else `src/a.rs`, ...). A `mod x;` declaration is the
parent owning its child, not an import. Test modules (`#[cfg(test)] mod tests { .. }`) are
cut before parsing, since a test may import what it tests from anywhere.

Prints each circle (files that reach each other through imports) with the names that tie
each arrow, and exits 1 when there is one; `--crate NAME` limits it to `crates/NAME`.

    python3 scripts/import_cycles.py            # every crate
    python3 scripts/import_cycles.py --crate runtime
"""

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATH_RE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP_RE = re.compile(r"\buse\s+(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*)\};", re.S)


def strip_tests(text: str) -> str:
    """The source without `#[cfg(test)]` items, comments and string literals."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    out, i = [], 0
    while True:
        j = text.find("#[cfg(test)]", i)
        if j < 0:
            out.append(text[i:])
            break
        out.append(text[i:j])
        k = text.find("{", j)
        semi = text.find(";", j)
        if k < 0 or (0 <= semi < k):
            i = semi + 1 if semi >= 0 else len(text)
            continue
        depth, p = 0, k
        while p < len(text):
            if text[p] == "{":
                depth += 1
            elif text[p] == "}":
                depth -= 1
                if depth == 0:
                    break
            p += 1
        i = p + 1
    return "".join(out)


def module_of(src: Path, f: Path) -> list:
    rel = f.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts and parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return parts


def file_of(src: Path, parts: list):
    """The deepest existing module file along `parts`."""
    for n in range(len(parts), -1, -1):
        base = src.joinpath(*parts[:n]) if n else src
        for cand in ([base.with_suffix(".rs"), base / "mod.rs"] if n else [src / "lib.rs", src / "main.rs"]):
            if cand.is_file():
                return cand
    return None


def paths_in(text: str):
    """(root, segments) of every path the text names, grouped `use` lists expanded."""
    for m in USE_GROUP_RE.finditer(text):
        root, prefix, body = m.group(1), m.group(2), m.group(3)
        for item in re.split(r",", re.sub(r"\{[^}]*\}", "", body)):
            item = item.strip().split(" as ")[0].strip()
            if item and item != "self":
                yield root, [s for s in (prefix + "::" + item).split("::") if s]
            elif item == "self":
                yield root, [s for s in prefix.split("::") if s]
    for m in PATH_RE.finditer(text):
        yield m.group(1), [s for s in m.group(2).split("::") if s]


def crate_graph(src: Path):
    files = sorted(p for p in src.rglob("*.rs"))
    edges = {f: {} for f in files}
    for f in files:
        me = module_of(src, f)
        is_dir_mod = f.name in ("mod.rs", "lib.rs", "main.rs")
        text = strip_tests(f.read_text(errors="replace"))
        for root, segs in paths_in(text):
            if root == "crate":
                parts = segs
            elif root == "super":
                parts = (me if is_dir_mod else me[:-1])[:-1] + segs
            else:
                parts = (me if is_dir_mod else me) + segs
            target = file_of(src, parts)
            if target is None or target == f:
                continue
            # A file naming its own child module (declared below it) is ownership, not an import.
            if module_of(src, target)[: len(me)] == me and is_dir_mod and root != "crate":
                pass
            edges[f].setdefault(target, set()).add(segs[-1])
    return edges


def circles(edges):
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
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
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--crate", help="only crates/NAME")
    args = ap.parse_args()
    crates = sorted((ROOT / "crates").iterdir())
    if args.crate:
        crates = [ROOT / "crates" / args.crate]
    found = 0
    for c in crates:
        src = c / "src"
        if not src.is_dir():
            continue
        edges = crate_graph(src)
        for comp in circles(edges):
            found += 1
            print(f"circle in {c.name}: " + ", ".join(str(f.relative_to(ROOT)) for f in comp))
            for a in comp:
                for b, names in sorted(edges[a].items()):
                    if b in comp:
                        print(f"  {a.relative_to(ROOT)} -> {b.relative_to(ROOT)}: {', '.join(sorted(names))}")
    if not found:
        print(f"no import circle in {len(crates)} crate(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
