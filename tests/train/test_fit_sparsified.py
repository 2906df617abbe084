"""``fit`` on a model that ``sparsify`` already made: given the handle (used as it is) or the
method's name (the handle rebuilt from what the states record), the target density and the
hyperparameters of ``sparsify`` hold; what would change them is refused before anything acts,
and a refusal leaves the model and the handle as they were given."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from dualdrop.nn import Sparsifier, sparsify
from dualdrop.nn.sparsifier import sparsified_with
from dualdrop.train.engine import CHECKPOINT, fit
from tests.train.test_fit_refusals import Given, ce, fresh, loader, refused

torch.set_num_threads(1)


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3))


def train_data(n=256):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 6, generator=g)
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 1).long()),
                      batch_size=32)


def dead_rows(w) -> int:
    return int((w == 0).all(1).sum())


@pytest.mark.parametrize("method", ["logsum", "vardrop-lr", "hardconcrete"])
@pytest.mark.parametrize("by", ["name", "handle"])
def test_the_target_density_of_sparsify_is_reached(method, by):
    net = mlp()
    sp = sparsify(net, method, target_density=0.2)
    out = fit(net, method if by == "name" else sp, train_data(), ce, epochs=4, lr=1e-2,
              progress=False)
    assert out.sparsifier.controller is not None and out.sparsifier.controller.target == 0.2
    assert out.sparsifier.density()["total"] == pytest.approx(0.2, abs=0.01)
    assert out.history[-1]["density"] == pytest.approx(0.2, abs=0.01)
    if by == "handle":
        assert out.sparsifier is sp


@pytest.mark.parametrize("by", ["name", "handle"])
def test_the_hyperparameters_of_sparsify_are_kept(by):
    net = mlp()
    sp = sparsify(net, "logsum", lam=3e-4, eps=0.5, granularity="neuron", target_density=0.25,
                  exclude=["2"])
    out = fit(net, "logsum" if by == "name" else sp, train_data(), ce, epochs=3, lr=1e-2,
              progress=False)
    hp = out.sparsifier.hparams
    assert (hp["lam"], hp["eps"], hp["granularity"]) == (3e-4, 0.5, "neuron")
    assert out.sparsifier.targets == ["0"]
    net.eval()
    w = net[0].weight.detach()
    assert dead_rows(w) == 24 and int((w != 0).sum()) == 8 * 6     # whole neurons pruned
    # the same hyperparameters given again are accepted
    fit(net, "logsum" if by == "name" else out.sparsifier, train_data(), ce, steps=2,
        hparams={"lam": 3e-4, "granularity": "channel"}, target_density=0.25, progress=False)


def test_a_second_fit_with_the_handle_keeps_the_masks_of_the_first():
    net = mlp()
    sp = sparsify(net, "logsum", target_density=0.2)
    fit(net, sp, train_data(), ce, epochs=3, lr=1e-2, progress=False)
    masks = [m.clone() for m in sp.controller.masks]
    fit(net, sp, train_data(), ce, epochs=1, lr=1e-3, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(masks, sp.controller.masks))
    assert sp.density()["total"] == pytest.approx(0.2, abs=0.01)


def test_the_one_shot_recipe_still_trains_by_name():
    net = mlp()
    sparsify(net, "magnitude", sparsity=0.0)
    with torch.no_grad():
        net[0].parametrizations.weight[0].weight_mask[:16] = 0
    fit(net, "magnitude", train_data(), ce, epochs=1, hparams={"sparsity": 0.0}, lr=1e-2,
        progress=False)
    net.eval()
    assert dead_rows(net[0].weight.detach()) == 16


def test_a_handle_without_a_controller_gets_one_and_reaches_it():
    net = mlp()
    sp = sparsify(net, "logsum")
    out = fit(net, sp, train_data(), ce, epochs=4, lr=1e-2, target_density=0.3, progress=False)
    assert out.sparsifier is sp and sp.controller.target == 0.3
    assert sp.density()["total"] == pytest.approx(0.3, abs=0.01)


def test_attach_and_a_deep_copy_keep_what_sparsify_recorded():
    net = mlp()
    sp = sparsify(net, "logsum", lam=3e-4, target_density=0.2)
    sp.set_tol(0.2)
    twin = copy.deepcopy(net)
    made = sparsified_with(twin)
    assert made["method"] == "logsum" and made["target_density"] == 0.2
    assert made["hparams"]["lam"] == 3e-4 and made["hparams"]["tol"] == pytest.approx(0.2)
    again = Sparsifier.attach(twin, "logsum")
    assert again.hparams["lam"] == 3e-4 and again.hparams["tol"] == pytest.approx(0.2)
    assert again.controller is None                    # only fit makes one from the record
    assert sparsified_with(mlp()) is None


def test_attach_ties_the_heads_again():
    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.att = nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            return self.att(x, x, x)[0]

    torch.manual_seed(0)
    model = Attn()
    sp = sparsify(model, "logsum", granularity="head")
    assert sp.ties
    assert Sparsifier.attach(copy.deepcopy(model), "logsum").ties == sp.ties


# ---- refused before anything acts, the model and the handle as given -----------------------------

def sparsified(**kw):
    model = fresh()
    return model, sparsify(model, "logsum", **kw)


@pytest.mark.parametrize("by", ["name", "handle"])
def test_other_hyperparameters_are_refused(by):
    model, sp = sparsified(lam=3e-4)
    err = refused(model, ValueError, r"hparams \{'lam': 0.01\} differ from those the model was "
                  r"sparsified with \(\{'lam': 0.0003\}\)", "logsum" if by == "name" else sp,
                  loader(), ce, steps=2, hparams={"lam": 1e-2})
    assert "\n" not in str(err)
    refused(model, TypeError, "unknown hyperparameter", "logsum" if by == "name" else sp,
            loader(), ce, steps=2, hparams={"lamda": 1e-2})
    assert sp.hparams["lam"] == 3e-4


@pytest.mark.parametrize("by", ["name", "handle"])
def test_another_target_density_is_refused(by):
    model, sp = sparsified(target_density=0.2)
    refused(model, ValueError, "sparsified with target_density=0.2, not 0.5",
            "logsum" if by == "name" else sp, loader(), ce, steps=2, target_density=0.5)
    assert sp.controller.target == 0.2


def test_magnitude_without_a_target_refuses_one():
    model = fresh()
    sp = sparsify(model, "magnitude")
    for method in ("magnitude", sp):
        refused(model, ValueError, "final sparsity is its hyperparameter sparsity=0.98",
                method, loader(), ce, steps=2, target_density=0.5)
    assert sp.controller is None


def test_a_handle_that_does_not_fit_the_model_is_refused():
    model, sp = sparsified()
    refused(fresh(), ValueError, "method: this Sparsifier is the handle of another model", sp,
            loader(), ce, steps=2)
    refused(model, TypeError, "method must be a method name .* or the Sparsifier", 3,
            loader(), ce, steps=2)
    refused(model, ValueError, r"already sparsified: .*\['logsum'\], not 'vardrop'", "vardrop",
            loader(), ce, steps=2)
    sp.remove()
    refused(model, ValueError, "was removed", sp, loader(), ce, steps=2)


def test_a_stale_handle_on_its_model_is_refused():
    model, sp = sparsified()
    stale = Sparsifier.attach(model, "logsum")
    sp.remove(leave_sparse=False)
    sparsify(model, "logsum")                          # new states, stale's are gone
    refused(model, ValueError, "no longer those of this Sparsifier", stale, loader(), ce,
            steps=2)


def test_units_coupled_by_example_inputs_need_the_handle():
    pytest.importorskip("torch_pruning")

    class Res(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.out = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 3)

        def forward(self, x):
            h = torch.relu(self.a(x))
            return self.out(h + torch.relu(self.b(h)))

    torch.manual_seed(0)
    model = Res()
    sp = sparsify(model, "logsum", granularity="neuron", exclude=["out"],
                  example_inputs=torch.zeros(2, 6), target_density=0.5)
    assert sparsified_with(model)["coupled"]
    refused(model, ValueError, r"example_inputs.*pass it as method \(fit\(model, sp, \.\.\.\)\)",
            "logsum", loader(), ce, steps=2)
    out = fit(model, sp, train_data(), ce, epochs=2, lr=1e-2, progress=False)
    model.eval()
    assert out.sparsifier is sp
    assert torch.equal((model.a.weight == 0).all(1), (model.b.weight == 0).all(1))


def test_a_refusal_while_acting_leaves_the_handle_as_given(tmp_path):
    # a checkpoint whose controller has pruned: loading it changes the controller, then the
    # first loss is refused and everything, the controller's state included, is put back
    fit(fresh(), "logsum", loader(), ce, steps=40, stop_after=30, target_density=0.5,
        checkpoint_dir=tmp_path, progress=False)
    ck = torch.load(tmp_path / CHECKPOINT, weights_only=True)
    assert ck["sparsifier"]["controller"]["masks"] is not None
    model, sp = sparsified(target_density=0.5)
    before = sp.controller.state_dict()
    given = Given(model)
    with pytest.raises(FloatingPointError, match="nan"):
        fit(model, sp, loader(), lambda m, b: ce(m, b) * float("nan"), steps=40,
            checkpoint_dir=tmp_path, progress=False)
    given.check()
    assert sp.controller.state_dict() == before and sp.controller.masks is None
    assert all(st.strength == 1.0 for _, st in sp.states())
    # a controller added by the refused call is taken back
    model, sp = sparsified()
    refused(model, FloatingPointError, "nan", sp, loader(), lambda m, b: ce(m, b) * float("nan"),
            steps=3, target_density=0.5)
    assert sp.controller is None
