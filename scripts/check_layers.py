#!/usr/bin/env python3
"""The layering of deltagrad's source folders, checked from their #include lines.

Bottom to top (a folder may include its own layer and any layer below it, never one above):

    include   the public headers (deltagrad.h, deltagrad_delta.h): declarations only
    core      tensors, storage, dtypes, errors, copies; declares in core/device.h what it needs of a
              device backend, which kernels/cuda defines
    kernels   compute on raw pointers: kernels/cpu, kernels/cuda (may include core's headers for
              dg_dtype and dg_error; kernels/cpu never includes kernels/cuda)
    autograd  the node, the tape and its engine, gradcheck
    ops       the typed entry points and the op registry (dg_op_def lives in autograd/node.h)
    models    layers, the language model, the optimiser, training (through ops, never kernels)
    tools     the deltagrad command
    tests, examples, bench, fuzz: above everything; they may include any folder

Besides the order, a few skips are refused (models go through ops, not to the kernels), and the
graph of folders (subfolders counted apart: ops and ops/delta are two nodes) must have no cycle.

Prints every folder-to-folder edge with its number of #include lines; exits 1 on an upward
edge, a refused skip or a cycle, naming the files.  Run from anywhere: python3 scripts/check_layers.py
"""
import os
import re
import subprocess
import sys

LAYERS = ['include', 'core', 'kernels', 'autograd', 'ops', 'models', 'tools']
TOP = {'tests', 'examples', 'bench', 'fuzz'}
# (from layer, to layer) pairs refused even though they point downward
REFUSED_SKIPS = {('models', 'kernels'): 'models reach the kernels through ops'}
SUBLAYER_ORDER = {'kernels': ['kernels/cpu', 'kernels/cuda']}  # cuda may use cpu's declarations

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
SOURCE = ('.c', '.h', '.cu', '.cuh')


def repo_root():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.dirname(here)


def tracked_sources(root):
    out = subprocess.run(['git', 'ls-files', '--cached', '--others', '--exclude-standard'], cwd=root,
                         capture_output=True, text=True, check=True).stdout.split()
    return sorted(f for f in out if f.endswith(SOURCE) and os.path.exists(os.path.join(root, f)))


def resolve(root, src, inc):
    """The repository path an include names: relative to the includer's folder, to the root, or
    to include/ (the -I paths of the build); None for a system or CUDA header."""
    for base in (os.path.dirname(src), '', 'include'):
        p = os.path.normpath(os.path.join(base, inc))
        if os.path.exists(os.path.join(root, p)):
            return p
    return None


def folder(path):
    return os.path.dirname(path) or '.'


def layer(path):
    return path.split('/')[0]


def main():
    root = repo_root()
    edges = {}  # (from folder, to folder) -> [(file, included)]
    for src in tracked_sources(root):
        with open(os.path.join(root, src), encoding='utf-8', errors='replace') as f:
            text = f.read()
        for inc in INCLUDE.findall(text):
            dst = resolve(root, src, inc)
            if dst is None:
                continue
            a, b = folder(src), folder(dst)
            if a != b:
                edges.setdefault((a, b), []).append((src, dst))

    errors = []
    for (a, b), uses in sorted(edges.items()):
        la, lb = layer(a), layer(b)
        print('%-22s -> %-22s %3d' % (a, b, len(uses)))
        why = None
        if la in TOP:
            continue
        if la not in LAYERS or lb not in LAYERS:
            why = 'a folder outside the layering (%s)' % (la if la not in LAYERS else lb)
        elif LAYERS.index(lb) > LAYERS.index(la):
            why = 'upward: %s is above %s' % (lb, la)
        elif (la, lb) in REFUSED_SKIPS:
            why = REFUSED_SKIPS[(la, lb)]
        elif la == lb and la in SUBLAYER_ORDER:
            order = SUBLAYER_ORDER[la]
            sa = next((s for s in order if a == s or a.startswith(s + '/')), None)
            sb = next((s for s in order if b == s or b.startswith(s + '/')), None)
            if sa and sb and order.index(sb) > order.index(sa):
                why = 'upward: %s is above %s' % (sb, sa)
        if why:
            errors.append('%s -> %s: %s\n    %s' % (a, b, why,
                          '\n    '.join('%s includes %s' % u for u in uses)))

    # cycles among folders (depth-first search, reporting each cycle's folders once)
    graph = {}
    for a, b in edges:
        if layer(a) not in TOP:
            graph.setdefault(a, set()).add(b)
    state, stack, seen_cycles = {}, [], set()

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                cyc = stack[stack.index(m):] + [m]
                key = frozenset(cyc)
                if key not in seen_cycles:
                    seen_cycles.add(key)
                    errors.append('cycle: ' + ' -> '.join(cyc) + '\n    ' + '\n    '.join(
                        '%s includes %s%s' % (edges[(x, y)][0] + (' (and %d more)' % (len(edges[(x, y)]) - 1)
                                                                  if len(edges[(x, y)]) > 1 else '',))
                        for x, y in zip(cyc, cyc[1:])))
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)

    if errors:
        print('\nlayering violations:', file=sys.stderr)
        for e in errors:
            print('  ' + e, file=sys.stderr)
        return 1
    print('layers: %d folder edges, all downward, no cycles' % len(edges))
    return 0


if __name__ == '__main__':
    sys.exit(main())
