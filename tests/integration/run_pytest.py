#!/usr/bin/env python3
"""Run pytest with the given arguments; exit 77 (skip) when it is missing."""
import sys

try:
    import pytest
except ImportError:
    print("pytest is not installed (apt-get install python3-pytest): skipping",
          file=sys.stderr)
    sys.exit(77)

sys.exit(pytest.main(sys.argv[1:]))
