#!/usr/bin/env python3
"""Where a process's CPU went, by thread and by system call, from a `perf
record -g` (or `--call-graph dwarf`) profile: the kernel's own frames are
all it reads.

    perf script -i PROFILE.data -F comm,ip,sym | bench/perf-syscalls.py

Each sample goes to its thread (the serving cores' threads together) and
to the system call it was taken in: the kernel frame just below
`do_syscall_64` (`do_writev`, `__x64_sys_recvfrom`, ...). A kernel sample
outside any system call (an interrupt, the scheduler) is counted as the
kernel's, and any other sample as user space. Unlike bench/perf-owners.py,
it needs no task frames, so the profile-guided build's inlined stacks do
not get in its way; it says nothing about which part of the gate's own
code a user-space sample belongs to (`perf report --no-children --sort
dso,sym` does).
"""
import collections
import sys


def thread(comm):
    return "the cores" if comm.startswith("hookgate-core") else comm


def where(frames):
    symbols = [f.split(None, 1)[1] if " " in f else f for f in frames]
    for i, symbol in enumerate(symbols):
        if symbol.startswith("do_syscall_64"):
            return "system call " + (symbols[i - 1] if i > 0 else "(unknown)")
    if frames and frames[0].startswith("ffffffff"):
        return "kernel, outside a system call"
    return "user space"


def samples(lines):
    comm, frames = None, []
    for line in lines:
        if not line.strip():
            if comm is not None:
                yield comm, frames
            comm, frames = None, []
        elif line[0] in " \t":
            frames.append(line.strip())
        else:
            comm, frames = line.split()[0], []
    if comm is not None:
        yield comm, frames


def main():
    counts = collections.Counter()
    for comm, frames in samples(sys.stdin):
        counts[(thread(comm), where(frames))] += 1
    total = sum(counts.values())
    if total == 0:
        sys.exit("no samples on stdin")
    print("| thread | where | share of the samples |")
    print("|---|---|--:|")
    for (who, what), n in counts.most_common():
        if n * 1000 >= total:
            print(f"| {who} | {what} | {100 * n / total:.1f}% |")
    print(f"({total} samples; rows under 0.1% left out)")


if __name__ == "__main__":
    main()
