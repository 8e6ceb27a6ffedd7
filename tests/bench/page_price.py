#!/usr/bin/env python3
"""tests/bench/page_price.py - what this machine charges for fresh memory.

A store whose records live for --ttl (24 h by default) grows for a day:
every new key writes into memory the process has never touched, and the
kernel takes a page fault and zeroes a page for it. How much that costs
depends on the machine far more than on idemproxy (a virtual machine whose
hypervisor shadows the guest's page tables pays for each fault twice), so
the memory store's new-key figures in docs/benchmarks.md are read next to
this one.

Maps ROUNDS times MIB MiB of anonymous memory and writes one byte per
4 KiB page: the first write of each page (a fault), then a second one (no
fault), and prints microseconds per page for both. Not a test.

    /usr/bin/python3 tests/bench/page_price.py [MIB] [ROUNDS]   # 256 3
"""
import mmap
import sys
import time

PAGE = mmap.PAGESIZE


def touch(m, pages):
    """Write one byte into each page of m; seconds taken."""
    t0 = time.perf_counter()
    for i in range(0, pages * PAGE, PAGE):
        m[i] = 1
    return time.perf_counter() - t0


def main():
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    pages = mib * 1024 * 1024 // PAGE
    for r in range(rounds):
        m = mmap.mmap(-1, pages * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        first = touch(m, pages)
        second = touch(m, pages)
        m.close()
        print(f"round {r + 1}: {pages} pages of {PAGE} B: first write "
              f"{first / pages * 1e6:.2f} us/page, second "
              f"{second / pages * 1e6:.2f} us/page (the loop alone)")


if __name__ == "__main__":
    main()
