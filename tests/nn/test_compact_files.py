"""save_compact / load_compact files: a refused file leaves the model as given, a folder is
refused in one line, an interrupted save leaves the previous file whole."""

import pytest
import torch
import torch.nn as nn

pytest.importorskip("torch_pruning")

from dualdrop.nn import compact, load_compact, save_compact  # noqa: E402
from dualdrop.nn._heads import HeadPrunedAttention  # noqa: E402


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.fc1, self.norm, self.fc2 = nn.Linear(8, 12), nn.LayerNorm(12), nn.Linear(12, 3)
        self.conv = nn.Conv1d(4, 4, 1)

    def forward(self, x):
        h = self.attn(x, x, x, need_weights=False)[0]
        return self.fc2(self.norm(torch.relu(self.fc1(h))))


def small_net():
    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():
        net.attn.out_proj.weight[:, 4:] = 0      # head 1 of 2: dead
    small = compact(net, torch.randn(2, 5, 8))
    assert isinstance(small.attn, HeadPrunedAttention)
    return small


def snapshot(model):
    return {n: type(m) for n, m in model.named_modules()}, \
        {k: v.clone() for k, v in model.state_dict().items()}


def edit(blob, how):
    sd = blob["state_dict"]
    if how == "norm shape":      # a LayerNorm cannot be resized: after fc1 would have been
        sd["fc1.weight"] = torch.zeros(6, 8)
        sd["fc1.bias"] = torch.zeros(6)
        sd["norm.weight"] = torch.zeros(6)
    elif how == "groups":        # resized first, then the groups entry refused
        sd["fc1.weight"] = torch.zeros(6, 8)
        blob["groups"] = {"fc1": 2}
    elif how == "missing key":
        del sd["fc2.bias"]
    elif how == "widths of a transformer":
        blob["hf"] = [{"intermediate_size": 4}]
    return blob


@pytest.mark.parametrize("how", ["norm shape", "groups", "missing key",
                                 "widths of a transformer"])
def test_a_refused_file_leaves_the_model_as_given(how, tmp_path):
    path = tmp_path / "small.pt"
    save_compact(small_net(), path)
    torch.save(edit(torch.load(path, weights_only=True), how), path)
    torch.manual_seed(1)
    fresh = Net()
    kinds, state = snapshot(fresh)
    with pytest.raises(ValueError, match="does not fit Net") as err:
        load_compact(path, fresh)
    assert "\n" not in str(err.value)
    kinds2, state2 = snapshot(fresh)
    assert kinds2 == kinds     # the attention was not replaced
    assert state2.keys() == state.keys()
    assert all(torch.equal(state2[k], state[k]) for k in state)   # nor a layer resized
    assert fresh.fc1.out_features == 12


def test_a_good_file_loads_after_a_refused_one(tmp_path):
    small, path = small_net(), tmp_path / "small.pt"
    save_compact(small, path)
    torch.manual_seed(1)
    fresh = Net()
    bad = tmp_path / "bad.pt"
    torch.save(edit(torch.load(path, weights_only=True), "norm shape"), bad)
    with pytest.raises(ValueError):
        load_compact(bad, fresh)
    back = load_compact(path, fresh)
    x = torch.randn(3, 4, 8)
    with torch.no_grad():
        torch.testing.assert_close(back(x), small(x), rtol=0, atol=0)


def test_folders_are_refused_in_one_line(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a folder") as err:
        save_compact(small_net(), tmp_path)
    assert "\n" not in str(err.value) and list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="is a folder"):
        load_compact(tmp_path, Net())


def test_an_interrupted_save_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    small, path = small_net(), tmp_path / "small.pt"
    save_compact(small, path)
    before = path.read_bytes()
    real = torch.save

    def dies(obj, f, *a, **k):
        real(obj, f, *a, **k)
        with open(f, "r+b") as h:   # half a file, then the process is interrupted
            h.truncate(100)
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies)
    with pytest.raises(KeyboardInterrupt):
        save_compact(small, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["small.pt"]
