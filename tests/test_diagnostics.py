"""Ahead-of-time diagonal dominance against a dense computation, and what it promises."""

import io

import numpy as np

import propop as pp
from cases import Case


def dense_ratios(system):
    A = system.matrix.toarray()
    off = np.abs(A - np.diag(np.diag(A))).sum(axis=1) / np.abs(np.diag(A))
    o = system.offsets
    return [off[o[k]:o[k + 1]].max() for k in range(system.nblocks)]


def test_ratios_match_the_explicit_matrix_in_both_forms():
    net, trace, eps, _ = Case((4, 5, 6, 3), activation="tanh", r=None).problem()
    B = pp.backward_system(net, trace, eps)
    for S in (B, B.paper()):
        np.testing.assert_allclose(pp.solvers.diagonal_dominance(S).ratios, dense_ratios(S),
                                   rtol=1e-12)


def test_dominant_system_contracts_every_jacobi_sweep():
    W = [0.3 * np.random.default_rng(k).standard_normal((6, 6)) / np.sqrt(6) for k in range(8)]
    net = pp.FNN(W, activation="tanh")
    x = np.random.default_rng(9).standard_normal((6, 2))
    trace = net.forward(x)
    B = pp.backward_system(net, trace, np.ones((6, 2)))
    d = pp.solvers.diagonal_dominance(B)
    assert d.dominant and "diagonally dominant" in str(d)
    exact = pp.solve(B, "substitution").x
    errors = []
    pp.solve(B, "jacobi", callback=lambda xk: errors.append(np.abs(xk - exact).max()))
    assert all(b <= max(d.ratios) * a + 1e-300 for a, b in zip(errors, errors[1:]))


def test_explain_says_whether_truncated_jacobi_saves_sweeps():
    """The estimate against the exact count, said plainly.

    Three layers: 18 sweeps for 1e-3 against 4 exact ones was printed as "about 18
    Jacobi sweeps give a 1e-3 approximate solution (no fewer than the exact count)".
    """
    from propop.solvers.selection.diagnostics import explain, jacobian_decay, nilpotency_index

    rng = np.random.default_rng(0)
    for depth, scale in ((3, 1.0), (60, 0.2)):
        net = pp.FNN([scale * rng.standard_normal((8, 8)) / np.sqrt(8) for _ in range(depth)],
                     activation="tanh")
        system = pp.backward_system(net, net.forward(np.ones((8, 2))), np.ones((8, 2)))
        sweeps, index = jacobian_decay(system).sweeps_for(1e-3), nilpotency_index(system)
        text = explain(system, file=io.StringIO())
        if sweeps >= index:
            assert depth == 3 and (f"take about {sweeps} Jacobi sweeps, no fewer than the "
                                   f"{index} that are exact: truncating saves nothing") in text
        else:
            assert depth == 60 and (f"about {sweeps} Jacobi sweeps give a 1e-3 approximate "
                                    f"solution ({index} are exact)") in text
