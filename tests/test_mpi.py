"""The mpi.* methods under real MPI: mpiexec -n 1, 2 and 4 (oversubscribed on 2 cores is fine).

``python -m mpi4py`` makes a failing rank abort all ranks instead of hanging, and
the subprocess has a timeout.
"""

import pathlib
import shutil
import subprocess
import sys

import pytest

# A guard against a hung job (each takes 1-5 s idle on 2 cores), never a speed check.
HANG = 600

TESTS = pathlib.Path(__file__).parent


def mpiexec():
    found = shutil.which("mpiexec", path=str(pathlib.Path(sys.executable).parent)) or \
        shutil.which("mpiexec")
    if found is None:
        pytest.skip('mpiexec not found: pip install "propop[mpi]"')
    return found


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_distributed_solves_equal_the_single_process_ones(ranks):
    command = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "pytest",
               "-q", "-p", "no:cacheprovider", "mpi/check_distributed.py"]
    result = subprocess.run(command, cwd=TESTS, capture_output=True, text=True, timeout=HANG)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert f"{30} passed" in result.stdout


def test_the_mpi_methods_run_in_one_process_too():
    import numpy as np

    import propop as pp
    from cases import Case, relative_error

    net, trace, eps, v = Case((4, 6, 6, 3), r=2).problem()
    system = pp.backward_system(net, trace, eps)
    for method in ("mpi.substitution", "mpi.cyclic-reduction", "mpi.jacobi", "mpi.gmres",
                   "mpi.bicgstab"):
        sol = pp.solve(system, method, rtol=1e-13, check=True)
        assert relative_error(sol.x, np.concatenate(v)) < 1e-10
        assert sol.info["ranks"] == 1


def test_propop_run_distributed_prints_one_table_with_per_rank_times():
    command = [mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", "-m", "propop", "run",
               "--distributed", "--layers", "5", "--width", "8", "--batch", "3",
               "--repeats", "5"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=HANG)
    assert result.returncode == 0, result.stderr[-4000:]
    out = result.stdout
    assert out.count("| method |") == 1 and "Distributed over 2 MPI ranks" in out
    rows = [line for line in out.splitlines() if line.startswith("| mpi.")]
    assert len(rows) == 5 and all("CONVERGED" in row for row in rows)
    assert all(len(row.split("|")[9].split()) == 2 for row in rows)  # a time per rank


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_fault_on_one_rank_stops_every_rank_and_none_hangs(ranks):
    command = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "pytest",
               "-q", "-p", "no:cacheprovider", "mpi/check_faults.py"]
    result = subprocess.run(command, cwd=TESTS, capture_output=True, text=True, timeout=HANG)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "44 passed" in result.stdout


@pytest.mark.parametrize("method", ["mpi.substitution", "mpi.cyclic-reduction", "mpi.jacobi",
                                    "mpi.gmres", "mpi.bicgstab"])
def test_an_exception_inside_a_solve_aborts_the_job_instead_of_hanging(method):
    command = [mpiexec(), "-n", "2", sys.executable, "mpi/check_abort.py", method]
    result = subprocess.run(command, cwd=TESTS, capture_output=True, text=True, timeout=HANG)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "MPI rank 1 failed inside a solve" in output, output
    assert "injected fault on rank 1" in output and "not reached" not in output, output


def test_a_script_raising_on_one_rank_ends_under_python_m_mpi4py():
    """The documented way to run: an uncaught exception on one rank aborts the job."""
    command = [mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py",
               "mpi/check_script_raises.py"]
    result = subprocess.run(command, cwd=TESTS, capture_output=True, text=True, timeout=HANG)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "the user's own code failed on rank 1" in output and "not reached" not in output
