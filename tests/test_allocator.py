"""propop.allocator: glibc's thresholds set in a running process, measured by page faults.

Each check runs in a child process, so that the test process keeps glibc's own
(adjusting) thresholds.
"""

import subprocess
import sys

import pytest

import propop as pp
from propop import allocator

GLIBC = allocator._glibc() is not None

# faults of the second of two 1 MiB arrays (256 pages; too small for a huge page):
# mapped fresh at 128 KiB thresholds, from the heap's kept pages once memory is kept
CHILD = """
import resource, sys
import numpy as np
import propop as pp

def faults():
    a = np.ones(2**17); del a  # 1 MiB, freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    b = np.ones(2**17)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    del b
    return after - before

assert pp.allocator.keep_freed(False) is True
given_back = min(faults() for _ in range(3))
assert pp.allocator.keep_freed() is True
kept = min(faults() for _ in range(3))
print(given_back, kept)
"""


@pytest.mark.skipif(not GLIBC or not sys.platform.startswith("linux"),
                    reason="glibc's mallopt: Linux with glibc only")
def test_kept_memory_is_not_faulted_in_again():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          check=True, timeout=120)
    given_back, kept = map(int, done.stdout.split())
    assert given_back >= 200  # 256 pages mapped fresh
    assert kept <= 20


def test_another_c_library_changes_nothing(monkeypatch):
    monkeypatch.setattr(allocator, "_glibc", lambda: None)
    assert pp.allocator.keep_freed() is False
    assert pp.allocator.keep_freed(False) is False


def test_a_refused_setting_raises(monkeypatch):
    class Refusing:
        @staticmethod
        def mallopt(parameter, value):
            return 0

    monkeypatch.setattr(allocator, "_glibc", lambda: Refusing)
    with pytest.raises(RuntimeError, match="M_MMAP_THRESHOLD = 33554432"):
        pp.allocator.keep_freed()
