"""Sparse-weight experiments: patterns, pruned training, the density report (issue 10)."""

import numpy as np
import pytest

import propop as pp
from cases import relative_error
from propop import sparsity
from propop.data import digits
from reference import torch


@pytest.fixture(scope="module")
def data():
    xtr, ytr, xte, yte = digits()
    return xtr[:, :600], ytr[:600], xte, yte


def mlp(seed=0, hidden=24):
    base = pp.FNN.random([64, hidden, 10], activation="tanh", seed=seed)
    return pp.FNN(base.W, base.b, activation=["tanh", "identity"])


def test_magnitude_pruning_keeps_the_largest_entries_at_the_density():
    W = np.random.default_rng(0).standard_normal((30, 40))
    net = sparsity.prune(pp.FNN([W], activation="tanh"), 0.3)
    kept = net.W[0].toarray() != 0
    assert kept.sum() == 360 and net.sparse
    threshold = np.sort(np.abs(W), axis=None)[-360]  # the 360th largest magnitude
    np.testing.assert_array_equal(kept, np.abs(W) >= threshold)
    np.testing.assert_array_equal(net.W[0].toarray()[kept], W[kept])  # values unchanged


def test_block_pruning_keeps_whole_tiles_of_largest_norm():
    W = np.random.default_rng(1).standard_normal((12, 16))
    kept = sparsity.mask(W, 0.25, "block", block=4)
    tiles = kept.reshape(3, 4, 4, 4).transpose(0, 2, 1, 3).reshape(12, 16)
    assert all(t.all() or not t.any() for t in tiles) and kept.sum() == 3 * 16
    norms = np.array([[np.linalg.norm(W[4 * i:4 * i + 4, 4 * j:4 * j + 4]) for j in range(4)]
                      for i in range(3)])
    chosen = kept[::4, ::4]
    assert norms[chosen].min() > norms[~chosen].max()


def test_banded_pruning_keeps_a_diagonal_band():
    W = np.random.default_rng(2).standard_normal((10, 10))
    kept = sparsity.mask(W, 0.5, "banded")  # 2h + 1 = 5 columns
    np.testing.assert_array_equal(kept, np.tril(np.triu(np.ones((10, 10)), -2), 2) == 1)
    wide = sparsity.mask(np.ones((4, 12)), 0.25, "banded")  # rectangular: stretched
    assert [list(np.flatnonzero(row)) for row in wide] == [[0, 1, 2], [3, 4, 5], [6, 7, 8],
                                                          [9, 10, 11]]


def test_random_structured_weights():
    B = sparsity.banded((6, 6), 1)
    rows, cols = B.nonzero()
    assert B.nnz == 6 + 2 * 5 and np.abs(rows - cols).max() == 1
    S = sparsity.block_sparse((8, 12), 4, 0.5, seed=3)
    tiles = S.toarray().reshape(2, 4, 3, 4).transpose(0, 2, 1, 3).reshape(6, 16)
    assert sorted(np.count_nonzero(t) for t in tiles) == [0, 0, 0, 16, 16, 16]


def test_pruned_gradients_are_the_dense_gradients_on_the_pattern():
    net = sparsity.prune(mlp(), 0.2, "block", block=4)
    x = np.random.default_rng(3).random((64, 5))
    labels = np.arange(5)
    g = pp.backprop(net, x, labels, "cross_entropy", "cyclic-reduction")
    Ws = [torch.tensor(W.toarray(), requires_grad=True) for W in net.W]
    z = torch.tanh(Ws[0] @ torch.tensor(x) + torch.tensor(net.b[0])[:, None])
    out = Ws[1] @ z + torch.tensor(net.b[1])[:, None]
    torch.nn.functional.cross_entropy(out.T, torch.tensor(labels), reduction="sum").backward()
    for W, dW, reference in zip(net.W, g.W, Ws):
        pattern = W.toarray() != 0
        assert set(zip(*dW.nonzero())) <= set(zip(*np.nonzero(pattern)))
        assert relative_error(dW.toarray(), reference.grad.numpy() * pattern) < 1e-12


@pytest.mark.parametrize("pattern", sparsity.PATTERNS)
def test_pruned_training_keeps_the_sparsity_pattern(data, pattern):
    xtr, ytr, _, _ = data
    pruned = sparsity.prune(mlp(hidden=32), 0.3, pattern)
    assert abs(sparsity.density_of(pruned) - 0.3) < 0.05
    trained, history = pp.train(pruned, xtr, ytr, epochs=2, batch_size=50, lr=0.5)
    for before, after in zip(pruned.W, trained.W):
        np.testing.assert_array_equal(after.indptr, before.indptr)
        np.testing.assert_array_equal(after.indices, before.indices)
        assert not np.array_equal(after.data, before.data)  # trained, on the pattern
    assert history.epochs[-1]["loss"] < history.epochs[0]["loss"]


def test_gradual_pruning_reaches_the_density_and_one_stage_is_one_shot(data):
    xtr, ytr, _, _ = data
    net, stages = sparsity.prune_gradually(mlp(), xtr, ytr, 0.2, stages=3, batch_size=50,
                                           lr=0.5)
    assert abs(sparsity.density_of(net) - 0.2) < 0.01 and len(stages) == 3
    once, _ = sparsity.prune_gradually(mlp(), xtr, ytr, 0.2, stages=1, batch_size=50, lr=0.5)
    by_hand, _ = pp.train(sparsity.prune(mlp(), 0.2), xtr, ytr, batch_size=50, lr=0.5)
    for a, b in zip(once.W, by_hand.W):
        np.testing.assert_array_equal(a.toarray(), b.toarray())


@pytest.mark.parametrize("pattern", ["magnitude", "block", "banded"])
def test_pruning_a_network_on_pytorch_keeps_it_there_and_prunes_as_on_numpy(data, pattern):
    """The pattern is chosen on the host; the pruned weights are CSR tensors on its device.

    ``mask`` took ``np.abs`` of a tensor, whose ``size`` is a method: pruning on
    PyTorch raised a TypeError.
    """
    pytest.importorskip("torch")
    from propop import backend

    xtr, ytr, _, _ = data
    net = mlp(hidden=32)
    moved = net.to("torch")
    np.testing.assert_array_equal(sparsity.mask(moved.W[0], 0.3, pattern),
                                  sparsity.mask(net.W[0], 0.3, pattern))
    ours, theirs = sparsity.prune(moved, 0.3, pattern), sparsity.prune(net, 0.3, pattern)
    assert ours.backend.name == "torch" and sparsity.density_of(ours) == \
        sparsity.density_of(theirs)
    for a, b in zip(ours.W, theirs.W):
        assert backend.of(a).name == "torch"
        np.testing.assert_array_equal(backend.to_host(a).toarray(), b.toarray())
    X = backend.convert(xtr, "torch")
    trained, _ = sparsity.prune_gradually(moved, X, ytr, 0.3, 2, 1, pattern, batch_size=50,
                                          lr=0.5)
    expected, _ = sparsity.prune_gradually(net, xtr, ytr, 0.3, 2, 1, pattern, batch_size=50,
                                           lr=0.5)
    for a, b in zip(trained.W, expected.W):
        assert relative_error(backend.to_host(a).toarray(), b.toarray()) < 1e-12
    with pytest.raises(TypeError, match="array_api_strict is dense here"):
        sparsity.prune(net.to("array_api_strict"), 0.3, pattern)
    with pytest.raises(ValueError, match="this network is on torch"):  # before any training
        sparsity.report(moved, X, ytr, [0.3], X, ytr, pattern, epochs=10**6)


def test_the_density_report(data):
    xtr, ytr, xte, yte = data
    rows = sparsity.report(mlp(hidden=48), xtr, ytr, [1.0, 0.05], xte, yte, "magnitude",
                           epochs=3, batch_size=50, lr=0.5, batch=8)
    assert [round(r["density"], 2) for r in rows] == [1.0, 0.05]
    for r in rows:
        assert r["cr_error"] < 1e-12 and r["levels"] == 2  # ceil(log2(l + 1)), l = 2
        assert 0 <= r["test_accuracy"] <= 1 and r["cr_seconds"] > 0
        assert r["substitution_seconds"] > 0
    assert rows[0]["test_accuracy"] > 0.8
    assert len(rows[1]["fill_in"]) >= 1 and all(f > 0 for f in rows[1]["fill_in"])


def test_bad_sparsity_input_is_named():
    with pytest.raises(ValueError, match=r"density must lie in \(0, 1\], got 0"):
        sparsity.prune(mlp(), 0)
    with pytest.raises(ValueError, match=r"density must lie in \(0, 1\], got 1.5"):
        sparsity.mask(np.ones((3, 3)), 1.5)
    with pytest.raises(ValueError, match="unknown pattern 'diagonal'; choose one of"):
        sparsity.prune(mlp(), 0.5, "diagonal")
    with pytest.raises(ValueError, match="block must be an integer >= 1, got 0"):
        sparsity.prune(mlp(), 0.5, "block", block=0)
    with pytest.raises(ValueError, match="repeats must be an integer >= 1, got 0"):
        sparsity.report(mlp(), np.ones((64, 2)), np.zeros(2, int), [0.5], None, None, repeats=0)
    with pytest.raises(ValueError, match="stages must be an integer >= 1, got 0"):
        sparsity.prune_gradually(mlp(), np.ones((64, 2)), np.zeros(2, int), 0.5, stages=0)
