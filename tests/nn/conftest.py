import numpy as np
import pytest
import torch

torch.set_num_threads(1)


# The tiny models live in a module with a unique name so that pickle can find their classes
# (every test folder has a module called "conftest").
from nn_tiny_models import TinyCNN, TinyMLP  # noqa: E402


def make_mlp(seed=0, **kw):
    torch.manual_seed(seed)
    return TinyMLP(**kw)


def make_cnn(seed=0):
    torch.manual_seed(seed)
    return TinyCNN()


@pytest.fixture(scope="session")
def tiny_data():
    """400 samples, 20 features, 4 classes; the label depends on the first 4 features only."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 20)).astype(np.float32)
    W = np.zeros((20, 4), np.float32)
    W[:4] = rng.standard_normal((4, 4))
    y = (X @ W).argmax(1)
    return torch.from_numpy(X), torch.from_numpy(y)


# hyperparameters that make each method act within 2 epochs (50 steps) on 400 samples; the
# larger tol of some is a test-time rule only (it makes the short runs' effect visible).
# lam is per example (for the Bayesian methods c / 400 is c times their ELBO-like default)
FAST_HPARAMS = {
    # vardrop at 3/400 sat at chance level on most seeds (0.31-0.59 over 14 seeds)
    "vardrop": {"lam": 1.0 / 400, "init_log_alpha": 0.0, "tol": 0.3},
    "vardrop-lr": {"lam": 1.0 / 400, "init_log_alpha": 0.0, "tol": 0.3},
    "vardrop-lr-ar": {"lam": 0.3 / 400},
    "hardconcrete": {"lam": 1.0 / 400, "droprate_init": 0.5},
    "hardconcrete-neuron": {"lam": 0.3 / 400, "droprate_init": 0.5},
    "magnitude": {"sparsity": 0.8, "prune_every": 2, "end": 0.6},
    # the released init p = 5 moves too slowly for 50 steps: start at eta_hat(w)
    "eta-trick": {"lam": 0.01, "eps": 1.0, "tol": 0.3, "eta_init": "eta_hat",
                  "prune_rule": "eta_hat"},
    "adaprox": {"lam": 0.01, "tol": 0.3},
    "adatikhonov": {"lam": 0.02, "tol": 0.3},
    "logsum": {"lam": 0.02, "tol": 0.3},
    "penalty:mcp": {"lam": 0.01, "tol": 0.3, "penalty_params": {"a": 3.0, "lam": 0.1}},
    "penalty:l1": {"lam": 0.006, "tol": 0.3},
}
FAST_LR = {"vardrop": 3e-2, "vardrop-lr": 3e-2, "vardrop-lr-ar": 1e-2, "hardconcrete": 0.1,
           "hardconcrete-neuron": 0.1}


def train(model, sp, X, y, epochs=2, batch=16, lr=1e-2, seed=0, opt=None, start_step=0,
          total_steps=None, stop_step=None, check=None):
    """Plain Adam loop (the contract's usage); returns the optimizer and the last step."""
    import torch.nn.functional as F

    if opt is None:
        opt = torch.optim.Adam(model.parameters(), lr=lr)
    n = len(y)
    steps_per_epoch = (n + batch - 1) // batch
    total = total_steps or epochs * steps_per_epoch
    step = start_step
    model.train()
    g = torch.Generator().manual_seed(seed)
    orders = [torch.randperm(n, generator=g) for _ in range(epochs)]
    torch.manual_seed(seed + 1)
    for e in range(epochs):
        for b in range(steps_per_epoch):
            k = e * steps_per_epoch + b + 1
            if k <= start_step:
                continue
            if stop_step is not None and k > stop_step:
                return opt, step
            idx = orders[e][b * batch:(b + 1) * batch]
            loss = F.cross_entropy(model(X[idx]), y[idx]) + sp.regularizer(n)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step = k
            sp.after_step(opt, step, total)
            if check is not None:
                check(step)
    return opt, step


@pytest.fixture(scope="session")
def h():
    """These helpers (conftest modules share a name across folders, so tests get them here).

    The namespace is taken from this function's own globals: ``sys.modules["conftest"]`` may be
    another folder's conftest when the whole suite runs."""
    import types

    return types.SimpleNamespace(**globals())
