# %% [markdown]
# # propop in your training loop
#
# A jupytext `py:percent` notebook. A PyTorch user changes one line: `nn.GRU` becomes
# `propop.torch.GRU` (its forward is Newton's method on the whole sequence, DEER, and
# its backward propop's solve of the backward system), or any traceable model is
# wrapped by `propop.torch.parallelize`. The optimiser, the loss, clipping and hooks
# stay as they are. Here a small GRU language model and a small CNN are trained both
# ways, side by side. Needs PyTorch (`pip install "propop[torch]"`).

# %%
import copy

import matplotlib.pyplot as plt
import torch

import propop.torch as ptorch

torch.manual_seed(0)
text = torch.randint(0, 12, (41, 8))  # 41 tokens in each of 8 sequences (time first)


class LanguageModel(torch.nn.Module):
    """Embedding, a 2-layer recurrent module, a linear head: next-token logits."""

    def __init__(self, recurrent):
        super().__init__()
        torch.manual_seed(1)
        self.embed = torch.nn.Embedding(12, 6, dtype=torch.float64)
        self.recurrent = recurrent
        self.head = torch.nn.Linear(16, 12, dtype=torch.float64)

    def forward(self, tokens):
        """Logits of the next token at every step."""
        return self.head(self.recurrent(self.embed(tokens))[0])


def train(model, steps=15):
    """Adam with clipping on the next-token loss; the loss of every step."""
    optimiser = torch.optim.Adam(model.parameters(), lr=0.03)
    losses = []
    for _ in range(steps):
        optimiser.zero_grad()
        logits = model(text[:-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 12), text[1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        losses.append(float(loss.detach()))
    return losses


# %% [markdown]
# The same weights, trained with `torch.nn.GRU` and with `propop.torch.GRU`
# (`from_module` copies them); the loss curves coincide.

# %%
plain_gru = torch.nn.GRU(6, 16, num_layers=2, dtype=torch.float64)
propop_gru = ptorch.from_module(plain_gru, mode="newton", method="cyclic-reduction")
plain, ours = LanguageModel(plain_gru), LanguageModel(propop_gru)
ours.load_state_dict(plain.state_dict())
plain_losses, our_losses = train(plain), train(ours)
difference = max(float((p - q).detach().abs().max()) for p, q in zip(ours.parameters(),
                                                           plain.parameters()))
print(f"largest parameter difference after 15 Adam steps: {difference:.1e}")
print("last forward:", propop_gru.last["iterations"], "Newton iterations, residuals",
      ", ".join(f"{r:.0e}" for r in propop_gru.last["residuals"]))
print("last backward:", propop_gru.last["backward"])

# %% [markdown]
# Any traceable model: `parallelize` returns the model itself (parameters, names and
# `state_dict` shared) whose backward is propop's solve. A residual CNN with bias-free
# convolutions and BatchNorm in evaluation mode:


# %%
class SmallCNN(torch.nn.Module):
    """Bias-free convolutions, BatchNorm, a residual block, a linear head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.conv1 = torch.nn.Conv2d(1, 4, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(4)
        self.conv2 = torch.nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.head = torch.nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        """Class logits."""
        h = torch.tanh(self.bn(self.conv1(x)))
        h = h + torch.tanh(self.conv2(h))
        return self.head(torch.nn.functional.avg_pool2d(h, 2).flatten(1))


images, labels = torch.randn(16, 1, 8, 8, dtype=torch.float64), torch.randint(0, 3, (16,))
cnn = SmallCNN().double().eval()
reference = copy.deepcopy(cnn)
parallel = ptorch.parallelize(cnn, method="substitution", example_input=images)


def train_cnn(model, steps=15):
    """Adam on the classification loss; the loss of every step."""
    optimiser = torch.optim.Adam(model.parameters(), lr=0.02)
    losses = []
    for _ in range(steps):
        optimiser.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimiser.step()
        losses.append(float(loss.detach()))
    return losses


cnn_plain, cnn_ours = train_cnn(reference), train_cnn(parallel)
worst = max(float((p - q).detach().abs().max())
            for p, q in zip(cnn.parameters(), reference.parameters()))
print(f"CNN parameter difference after 15 Adam steps: {worst:.1e}")
print("last backward:", parallel.propop.last["backward"])

# %%
figure, axes = plt.subplots(1, 2, figsize=(9, 3.2))
for ax, (title, a, b) in zip(axes, (("2-layer GRU language model", plain_losses, our_losses),
                                    ("residual CNN", cnn_plain, cnn_ours))):
    ax.plot(range(1, len(a) + 1), a, "o-", label="torch autograd")
    ax.plot(range(1, len(b) + 1), b, "x--", label="propop (Newton forward, CR backward)"
            if "GRU" in title else "propop (substitution backward)")
    ax.set_title(title)
    ax.set_xlabel("Adam step")
    ax.set_ylabel("cross-entropy")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend()
figure.suptitle("The same training, with PyTorch's backward and with propop's")
figure.tight_layout()
plt.show()

# %% [markdown]
# Truncated backpropagation through time: the state at the end of one chunk starts the
# next (`h0`, detached), as a language model over a long text is trained. The drop-in
# module takes `h0` in every mode and returns `dE/dh0` when it asks for one.

# %%
def truncated(recurrent, chunks=4, length=10):
    """Adam over consecutive chunks of the text, each starting from the last state."""
    model = LanguageModel(recurrent)
    optimiser = torch.optim.Adam(model.parameters(), lr=0.03)
    state, losses = None, []
    for k in range(chunks):
        tokens = text[k * length: (k + 1) * length + 1]
        optimiser.zero_grad()
        out, state = model.recurrent(model.embed(tokens[:-1]), state)
        loss = torch.nn.functional.cross_entropy(model.head(out).reshape(-1, 12),
                                                 tokens[1:].reshape(-1))
        loss.backward()
        optimiser.step()
        state = state.detach()
        losses.append(float(loss.detach()))
    return losses


plain_gru = torch.nn.GRU(6, 16, num_layers=2, dtype=torch.float64)
carried = ptorch.from_module(plain_gru, mode="newton", method="cyclic-reduction")
a, b = truncated(plain_gru), truncated(carried)
print("chunk losses, torch.nn.GRU:", ", ".join(f"{v:.6f}" for v in a))
print("chunk losses, propop GRU:  ", ", ".join(f"{v:.6f}" for v in b))
print(f"largest difference: {max(abs(x - y) for x, y in zip(a, b)):.1e}")

# %% [markdown]
# A transformer's MLP half, pre-norm LayerNorm and a SwiGLU unit: `from_torch` imports
# the LayerNorm and the product of two tensors exactly (a `Multiply` node on `[a; b]`),
# so `parallelize` trains it as autograd does.


# %%
class SwiGLUBlock(torch.nn.Module):
    """x + W3 (silu(W1 LN(x)) * W2 LN(x)), then a head."""

    def __init__(self, width=8, hidden=16):
        super().__init__()
        torch.manual_seed(3)
        self.norm = torch.nn.LayerNorm(width)
        self.gate, self.up = torch.nn.Linear(width, hidden), torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width, bias=False)
        self.head = torch.nn.Linear(width, 3)

    def forward(self, x):
        """Class logits."""
        y = self.norm(x)
        return self.head(x + self.down(torch.nn.functional.silu(self.gate(y)) * self.up(y)))


inputs = torch.randn(16, 8, dtype=torch.float64)
block = SwiGLUBlock().double()
reference = copy.deepcopy(block)
wrapped = ptorch.parallelize(block, method="level-scheduled")
optimisers = [torch.optim.Adam(m.parameters(), lr=0.02) for m in (reference, wrapped)]
for _ in range(10):
    for model, optimiser in zip((reference, wrapped), optimisers):
        optimiser.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs), labels).backward()
        optimiser.step()
worst = max(float((p - q).detach().abs().max()) for p, q in zip(block.parameters(),
                                                      reference.parameters()))
print(f"SwiGLU block parameter difference after 10 Adam steps: {worst:.1e}")
print("last backward:", wrapped.propop.last["backward"])

# %% [markdown]
# Attention, as a PyTorch user writes it: `nn.MultiheadAttention` over a sequence of
# tokens with a causal mask (`nn.Transformer.generate_square_subsequent_mask`), a learned
# position embedding read at `torch.arange(T)` as nanoGPT's `wpe(pos)`, and a LayerNorm.
# `from_torch` imports the packed projections, the mask (the masked weights exact zeros)
# and the embedding (an `ElementwiseAffine` reading the table's rows: its gradient the
# table's); `parallelize` trains it as autograd does.


# %%
class CausalBlock(torch.nn.Module):
    """x + wpe(pos), causal self-attention, LayerNorm, a per-token head."""

    def __init__(self, tokens=6, width=8):
        super().__init__()
        torch.manual_seed(4)
        self.wpe = torch.nn.Embedding(tokens, width)
        self.attn = torch.nn.MultiheadAttention(width, 2, batch_first=True)
        self.norm, self.head = torch.nn.LayerNorm(width), torch.nn.Linear(width, 3)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(
            tokens))

    def forward(self, x):
        """Logits per token."""
        pos = torch.arange(0, x.size(1), dtype=torch.long, device=x.device)
        h = x + self.wpe(pos)
        h = h + self.attn(h, h, h, attn_mask=self.mask, need_weights=False)[0]
        return self.head(self.norm(h))


sequences = torch.randn(16, 6, 8, dtype=torch.float64)
token_labels = torch.randint(0, 3, (16, 6), generator=torch.Generator().manual_seed(5))
causal = CausalBlock().double()
reference = copy.deepcopy(causal)
wrapped = ptorch.parallelize(causal, method="substitution", example_input=sequences)
optimisers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (reference, wrapped)]
for _ in range(10):
    for model, optimiser in zip((reference, wrapped), optimisers):
        optimiser.zero_grad()
        torch.nn.functional.cross_entropy(model(sequences).reshape(-1, 3),
                                          token_labels.reshape(-1)).backward()
        optimiser.step()
worst = max(float((p - q).detach().abs().max()) for p, q in zip(causal.parameters(),
                                                      reference.parameters()))
print(f"causal attention block parameter difference after 10 SGD steps: {worst:.1e}")

# %% [markdown]
# ## On a GPU
#
# propop's native methods run where the tensors are (`backend="torch"` keeps
# `parallelize`'s graph on the inputs' device). Every one of them has run on an NVIDIA
# H200, on PyTorch CUDA and on CuPy, and agreed with NumPy on every layout (SciPy's
# `gmres`, `cgs` and `lsmr` on CuPy too, through `cupyx`); the timings
# there against autograd, JAX, DEER's `seq1d` and pararnn-torch are in
# `benchmarks/results/gpu.md` (cyclic reduction 2.0-3.7x faster than autograd on deep
# MLPs, 0.56-0.66x autograd's time on RNNs in float64; Newton slower than
# DEER's compiled iteration). Sequences longer than cuDNN's 65535 steps run in chained
# kernel calls. A training step with these modules has not been timed on a GPU yet.
# Where a method has run:

# %%
import propop as pp

print(pp.solvers.info("cyclic-reduction").tested)
