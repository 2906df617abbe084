"""The pipeline's sources of weights: pruning from disk holds one block at a time (a finished
block's tensors are freed before the next is read), and the ranks' calibration checksum."""

import gc
import weakref

import pytest
import torch

from dualdrop.nn import prune_oneshot_from_disk
from dualdrop.nn.oneshot import sources
from dualdrop.nn.oneshot.distributed import calibration_digest

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_from_disk_frees_each_block_before_reading_the_next(tmp_path, monkeypatch):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=4, hidden_size=32, intermediate_size=64,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=100)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "src")
    read: dict[int, list] = {}   # block -> weak references to the tensors read for it
    alive_at_load = {}
    set_param = sources._Tensors._set
    load = sources.SafetensorsSource.load

    def tracking_set(self, names, tensor):
        set_param(self, names, tensor)
        if tensor.device.type != "meta" and names[0].startswith("model.layers."):
            read.setdefault(int(names[0].split(".")[2]), []).append(
                weakref.ref(self.params[names[0]]))

    def tracking_load(self, k, block):
        gc.collect()
        alive_at_load[k] = sum(r() is not None for j, refs in read.items() if j != k
                               for r in refs)
        return load(self, k, block)

    monkeypatch.setattr(sources._Tensors, "_set", tracking_set)
    monkeypatch.setattr(sources.SafetensorsSource, "load", tracking_load)
    g = torch.Generator().manual_seed(1)
    calib = [{"input_ids": torch.randint(0, 100, (2, 8), generator=g)} for _ in range(2)]
    report = prune_oneshot_from_disk(tmp_path / "src", calib, "magnitude", tmp_path / "out",
                                     target_density=0.5, progress=False)
    assert sorted(read) == [0, 1, 2, 3] and all(len(read[k]) >= 9 for k in range(1, 4))
    # block 0 is probed (read, run once, freed) while the chain is checked, then read again
    assert alive_at_load == {0: 0, 1: 0, 2: 0, 3: 0}
    gc.collect()
    assert all(r() is None for refs in read.values() for r in refs)
    assert len(report.pipeline["block_info"]) == 4


def test_the_calibration_checksum_sees_one_token():
    a = [{"input_ids": torch.arange(12).reshape(2, 6)}, {"input_ids": torch.ones(2, 6).long()}]
    b = [{"input_ids": torch.arange(12).reshape(2, 6)}, {"input_ids": torch.ones(2, 6).long()}]
    assert calibration_digest(a) == calibration_digest(b)
    b[1]["input_ids"][1, 5] = 2
    assert calibration_digest(a)[1] != calibration_digest(b)[1]
    assert calibration_digest(a[:1])[0] == 1
    # the same values in another dtype or shape are other data
    assert calibration_digest([torch.zeros(4)])[1] != calibration_digest([torch.zeros(2, 2)])[1]
    assert calibration_digest([torch.zeros(4)])[1] != calibration_digest(
        [torch.zeros(4, dtype=torch.float64)])[1]
