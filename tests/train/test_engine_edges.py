"""dualdrop.train.fit at its edges: a run stopped exactly at an epoch's end resumes; a model
with nothing to train is refused by name, left as given."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from dualdrop.nn.sparsifier import is_sparsified
from dualdrop.train.engine import fit

torch.set_num_threads(1)


def _data():
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(48, 10, generator=g), torch.randint(0, 3, (48,),
                                                                        generator=g))


def _ce(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


def _run(ckdir, stop_after=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))
    loader = DataLoader(_data(), batch_size=8, shuffle=True)          # 6 steps an epoch
    out = fit(model, "logsum", loader, _ce, epochs=3, lr=1e-2, checkpoint_dir=ckdir,
              checkpoint_every=len(loader), stop_after=stop_after, progress=False,
              log_every=2, val_loader=DataLoader(_data(), batch_size=16))
    return model, out


@pytest.mark.parametrize("stop", [6, 12])
def test_stopped_at_an_epochs_end_resumes_exactly(tmp_path, stop):
    ref, ref_out = _run(str(tmp_path / "a"))
    _, part = _run(str(tmp_path / "b"), stop_after=stop)
    assert part.step == stop and not part.finished
    res, res_out = _run(str(tmp_path / "b"))       # failed: "yielded no batch in an epoch"
    assert res_out.finished and res_out.step == ref_out.step == 18
    for k, v in ref.state_dict().items():
        w = res.state_dict()[k]
        assert torch.equal(v, w) if isinstance(v, torch.Tensor) else v == w, k
    assert res_out.history == ref_out.history


def test_a_model_with_nothing_to_train_is_refused_as_given():
    model = nn.Sequential(nn.Linear(10, 3))
    for p in model.parameters():
        p.requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loader = DataLoader(_data(), batch_size=8)
    for method in ("magnitude", "logsum"):
        with pytest.raises(ValueError, match="no parameter to train.*requires_grad=False"):
            fit(model, method, loader, _ce, epochs=1, progress=False)
        assert not is_sparsified(model)
        assert list(model.state_dict()) == list(before)
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # a method with parameters of its own trains them on frozen weights
    out = fit(model, "vardrop", loader, _ce, epochs=1, progress=False)
    assert out.finished


def test_a_checkpoint_of_other_settings_is_refused_not_resumed(tmp_path):
    _run(str(tmp_path), stop_after=4)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loader = DataLoader(_data(), batch_size=8, shuffle=True)
    for kw, match in (({"lr": 1e-3}, "lr: 0.01 in the checkpoint, 0.001 now"),
                      ({"hparams": {"eps": 0.5}}, "hparams:")):
        with pytest.raises(ValueError, match=match):
            fit(model, "logsum", loader, _ce, **{"epochs": 3, "lr": 1e-2, **kw},
                checkpoint_dir=str(tmp_path), progress=False)
        assert not is_sparsified(model)
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
