#!/usr/bin/env python3
"""Import graph between sibling modules of a crate (crate::/super:: paths resolved), and its cycles.
Usage: modgraph.py SRC_DIR [--all]   (default: only the crate's top level and http/)
Test code (files named tests.rs or under tests/, and `#[cfg(test)] mod` blocks) is left out."""
import os, re, sys
src = sys.argv[1]; show_all = '--all' in sys.argv
def modpath(rel):
    parts = rel[:-3].split('/')
    if parts[-1] in ('mod', 'lib', 'main'): parts = parts[:-1]
    return parts
def strip_tests(text):
    # drop `#[cfg(test)]` items (a mod block or a single item) by brace matching
    out = []; i = 0
    while True:
        j = text.find('#[cfg(test)]', i)
        if j < 0: out.append(text[i:]); break
        out.append(text[i:j]); k = j + len('#[cfg(test)]')
        semi = text.find(';', k); brace = text.find('{', k)
        if brace < 0 or (0 <= semi < brace): i = semi + 1; continue
        depth = 0; p = brace
        while p < len(text):
            if text[p] == '{': depth += 1
            elif text[p] == '}':
                depth -= 1
                if depth == 0: break
            p += 1
        i = p + 1
    return ''.join(out)
pat = re.compile(r'\b((?:crate|super)(?:::(?:super|\w+))+|(?:crate|super)::\{)')
edges = {}
mods = set()
for d, _, fs in os.walk(src):
    for f in fs:
        if f.endswith('.rs'): mods.add(tuple(modpath(os.path.relpath(os.path.join(d, f), src))))
for d, _, fs in os.walk(src):
    for f in fs:
        if not f.endswith('.rs'): continue
        rel = os.path.relpath(os.path.join(d, f), src)
        if f == 'tests.rs' or '/tests/' in '/' + rel: continue
        me = modpath(rel); mods.add(tuple(me))
        text = strip_tests(open(os.path.join(d, f)).read())
        text = re.sub(r'//[^\n]*', '', text)
        # expand `use crate::{a::x, b}` groups one level
        for m in re.finditer(r'\b(crate|super(?:::super)*)::\{([^}]*)\}', text):
            base = m.group(1)
            for item in m.group(2).split(','):
                item = item.strip().split('::')[0].strip()
                if item and re.match(r'\w+$', item):
                    text += f'\n{base}::{item}::_'
        for m in pat.finditer(text):
            segs = m.group(1).split('::')
            if segs[-1] == '{': segs = segs[:-1]
            if segs[0] == 'crate': target = segs[1:]
            else:
                cur = list(me)
                while segs and segs[0] == 'super': cur = cur[:-1]; segs = segs[1:]
                target = cur + segs
            if not target: continue
            # longest common prefix: an edge between the two siblings below it
            n = 0
            while n < min(len(me), len(target)) and me[n] == target[n]: n += 1
            if n >= len(me) or n >= len(target): continue
            parent = tuple(me[:n]); a, b = me[n], target[n]
            if a != b and tuple(list(parent) + [b]) in mods: edges.setdefault(parent, {}).setdefault(a, set()).add(b)
def cycles(g):
    # strongly connected components (Tarjan)
    idx = {}; low = {}; st = []; on = set(); out = []; c = [0]
    def go(v):
        idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
        for w in g.get(v, ()):
            if w not in idx: go(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(sorted(comp))
    for v in list(g):
        if v not in idx: go(v)
    return out
bad = 0
for parent in sorted(edges):
    if not show_all and parent not in ((), ('http',)): continue
    g = edges[parent]; name = '::'.join(parent) or 'crate'
    cs = cycles(g)
    print(f"{name}: " + '; '.join(f"{a} -> {', '.join(sorted(bs))}" for a, bs in sorted(g.items())))
    for comp in cs:
        bad += 1
        pairs = [f"{a}->{b}" for a in comp for b in sorted(g.get(a, ())) if b in comp]
        print(f"  CYCLE in {name}: {{{', '.join(comp)}}}  via {', '.join(pairs)}")
print("acyclic" if bad == 0 else f"{bad} cycle(s)")
sys.exit(1 if bad else 0)
