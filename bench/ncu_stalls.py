#!/usr/bin/env python3
"""Where a kernel's warps wait, instruction by instruction, from an ncu source export.

Input: the CSV that `ncu -i REPORT --page source --csv --print-source cuda,sass` writes for a
report taken with `--section SourceCounters` (and a build with -lineinfo).  That CSV holds, per
source file, each source line followed by its SASS instructions; every row has the warp-state
samples of that line or instruction ("Warp Stall Sampling (All Samples)") and their split by stall
reason (stall_long_sb, stall_barrier, ...).  A source line's row repeats, at each level of
inlining, the samples of instructions listed under it, so this script counts each SASS address
once, under the innermost line that names it in a .cu file where there is one.

Output: the kernel's samples by stall reason, then the top instructions: share of the samples,
address, SASS text, its two largest stall reasons, and its source line.  A sample belongs to the
instruction that waits; what it waits for is a few instructions up (an LDL: a spill's reload; an
LDG: a global load; a BAR: a barrier).  --lines groups by source line instead.
--range A:B keeps only the instructions whose .cu line lies in [A, B] (a warp group of a
warp-specialised kernel, e.g. b_dhu_ws's chain), by the last .cu line seen in address order.

    python3 bench/ncu_stalls.py f_state.csv [--top 25] [--lines] [--range 161:240]

bench/gpu_ncu_stalls.sh makes the CSV; docs/PERF.md ("Per kernel: ncu") says how to read it.
"""
import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"


def read_instructions(path):
    """{address: (sass, samples, {reason: samples}, 'file:line source')} and the header"""
    seen = {}
    cur_file, line, header = None, None, None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "File Path":
                cur_file = row[1].rsplit("/", 1)[-1]
                continue
            if row[0] == "Line No":
                header = row
                continue
            if header is None or len(row) < len(header):
                continue
            if row[0] != "":  # a source line
                line = f"{cur_file}:{row[0]} {row[1].strip()[:60]}"
                continue
            if not row[2].startswith("0x"):
                continue
            addr = int(row[2], 16)
            col = header.index(SAMPLES)
            reasons = {}
            for i, name in enumerate(header):
                if name.startswith("stall_") and "Not Issued" not in name and row[i] not in ("", "0", "-"):
                    reasons[name[6:]] = int(row[i])
            # keep the .cu attribution where an address is listed under several files
            if addr not in seen or cur_file.endswith(".cu"):
                seen[addr] = (row[3].strip(), int(row[col] or 0), reasons, line)
    if header is None:
        sys.exit(f"{path}: no source table (was it exported with --page source --csv?)")
    return seen


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--lines", action="store_true", help="group by source line")
    ap.add_argument("--range", help="A:B, .cu lines of one warp group")
    a = ap.parse_args()
    seen = read_instructions(a.csv)
    addrs = sorted(seen)
    if a.range:
        lo, hi = (int(x) for x in a.range.split(":"))
        keep, last_cu = [], None
        for ad in addrs:
            src = seen[ad][3] or ""
            if ".cu:" in src.split(" ")[0]:
                last_cu = int(src.split(" ")[0].rsplit(":", 1)[1])
            if last_cu is not None and lo <= last_cu <= hi:
                keep.append(ad)
        addrs = keep
    total = sum(seen[ad][1] for ad in addrs) or 1
    by_reason = collections.Counter()
    for ad in addrs:
        by_reason.update(seen[ad][2])
    print(f"{len(addrs)} instructions, {total} samples; by reason: "
          + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in by_reason.most_common(10)))
    if a.lines:
        groups = collections.defaultdict(lambda: [0, collections.Counter()])
        for ad in addrs:
            g = groups[seen[ad][3]]
            g[0] += seen[ad][1]
            g[1].update(seen[ad][2])
        for src, (n, rs) in sorted(groups.items(), key=lambda kv: -kv[1][0])[: a.top]:
            top2 = ", ".join(f"{k} {v}" for k, v in rs.most_common(2))
            print(f"{100 * n / total:5.1f}%  [{top2}]  {src}")
        return
    for ad in sorted(addrs, key=lambda x: -seen[x][1])[: a.top]:
        sass, n, rs, src = seen[ad]
        top2 = ", ".join(f"{k} {v}" for k, v in collections.Counter(rs).most_common(2))
        print(f"{100 * n / total:5.1f}%  {ad & 0xFFFFF:05x}  {sass[:48]:48s} [{top2}]  {src}")


if __name__ == "__main__":
    main()
