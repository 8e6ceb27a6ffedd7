#!/usr/bin/env python3
"""Print one "N passed, N failed" line for a `meson test` run.

Counts individual test cases, not meson test programs: TAP lines of the unit
tests and the pytest summary of the integration suite. Exit 1 when anything
failed or nothing ran.
"""
import json
import re
import sys


def main(path):
    passed = failed = skipped = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            t = json.loads(line)
            out = t.get("stdout") or ""
            result = t.get("result")
            if t.get("protocol") == "tap" or re.search(r"^1\.\.\d+$", out, re.M):
                passed += len(re.findall(r"^ok \d+", out, re.M))
                failed += len(re.findall(r"^not ok \d+", out, re.M))
                if result not in ("OK", "EXPECTEDFAIL", "SKIP") and \
                        not re.search(r"^not ok", out, re.M):
                    failed += 1      # crashed, timed out or a bad plan
                continue
            m = re.findall(r"=+ (.*?) in [\d.]+s", out)
            if m:
                summary = m[-1]
                for n, what in re.findall(r"(\d+) (passed|failed|error|errors|skipped)",
                                          summary):
                    if what == "passed":
                        passed += int(n)
                    elif what == "skipped":
                        skipped += int(n)
                    else:
                        failed += int(n)
                if result not in ("OK", "SKIP") and "failed" not in summary \
                        and "error" not in summary:
                    failed += 1
                continue
            if result == "SKIP":
                skipped += 1
            elif result == "OK":
                passed += 1
            else:
                failed += 1
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
