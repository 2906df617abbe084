"""The sequential block pipeline of prune_oneshot: the same result as the layer-by-layer walk,
a cost linear in depth, padding kept out of the Grams, the activation cache on disk, per-block
resume (a killed process started again), and pruning a checkpoint from disk."""

import copy
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from torch import nn

from dualdrop.nn import prune_oneshot, prune_oneshot_from_disk
from dualdrop.nn.oneshot import OneShotMethod
from dualdrop.nn.oneshot.methods.magnitude import Magnitude

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def tiny_gpt2(layers=3):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=layers, n_embd=32, n_head=4, n_positions=64,
                                  vocab_size=100, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def tiny_llama(layers=3):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=layers, hidden_size=32,
                                   intermediate_size=64, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=100)
    return transformers.LlamaForCausalLM(cfg)


def tiny_bert(layers=2):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(num_hidden_layers=layers, hidden_size=32, intermediate_size=64,
                                  num_attention_heads=4, vocab_size=100)
    return transformers.BertModel(cfg)


def token_batches(n=3, batch=4, length=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, 100, (batch, length), generator=g)} for _ in range(n)]


class Blocks(nn.Module):
    """An input projection (prologue), a ModuleList of residual MLP blocks, a head
    (epilogue)."""

    def __init__(self, depth=4, width=12):
        super().__init__()
        self.inp = nn.Linear(6, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width))
            for _ in range(depth))
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        h = self.inp(x)
        for blk in self.blocks:
            h = blk(h)
        return self.head(h)


def pruned_pair(model, calib, method="sparsegpt", **kw):
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    ra = prune_oneshot(a, calib, method, progress=False, sequential="layer", **kw)
    rb = prune_oneshot(b, calib, method, progress=False, **kw)
    return a, b, ra, rb


def max_diff(a, b):
    return max(float((pa - pb).abs().max())
               for pa, pb in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.parametrize("make, calib, blocks, kw", [
    (tiny_gpt2, token_batches(), "transformer.h", {"target_density": 0.5}),
    (tiny_gpt2, token_batches(), "transformer.h", {"pattern": "2:4", "method": "wanda"}),
    (tiny_llama, token_batches(), "model.layers", {"target_density": 0.3}),
    (tiny_bert, token_batches(), "encoder.layer", {"target_density": 0.5}),
    (Blocks, [torch.randn(20, 6) for _ in range(3)], "blocks", {"target_density": 0.4}),
])
def test_the_block_pipeline_equals_the_layer_walk(make, calib, blocks, kw):
    kw = dict(kw)
    method = kw.pop("method", "sparsegpt")
    a, b, ra, rb = pruned_pair(make(), calib, method, **kw)
    assert rb.report.pipeline["mode"] == "block"
    assert rb.report.pipeline["blocks"] == blocks
    assert ra.report.pipeline["mode"] == "layer"
    assert [r["layer"] for r in ra.report.layers] == [r["layer"] for r in rb.report.layers]
    assert max_diff(a, b) == 0.0
    for x, y in zip(ra.report.layers, rb.report.layers):
        assert x["objective"] == pytest.approx(y["objective"], rel=1e-9, abs=1e-12)


def count_calls(model, names):
    counts = {n: 0 for n in names}
    mods = dict(model.named_modules())
    hs = [mods[n].register_forward_pre_hook(lambda m, a, n=n: counts.__setitem__(n, counts[n] + 1))
          for n in names]
    return counts, hs


def test_the_cost_is_linear_in_depth():
    """Each block's layers run a number of times that does not grow with the block's depth
    (the layer walk runs the first block once more for every later layer)."""
    calib = [torch.randn(10, 6) for _ in range(4)]
    first, last = "blocks.0.0", "blocks.7.0"
    calls = {}
    for mode in ("layer", "auto"):
        net = Blocks(depth=8)
        counts, hs = count_calls(net, [first, last])
        prune_oneshot(net, calib, "magnitude", target_density=0.5, progress=False,
                      sequential=mode)
        for h in hs:
            h.remove()
        calls[mode] = dict(counts)
    assert calls["layer"][first] > 3 * calls["layer"][last]      # quadratic: early blocks rerun
    # linear: every block alike (the first runs once more, on one batch, to learn the shape
    # of a block's output)
    assert calls["auto"][last] <= calls["auto"][first] <= calls["auto"][last] + 1
    assert calls["auto"][first] <= 6 * len(calib)


class GramRecorder(OneShotMethod):
    name = "gram-recorder"
    defaults: dict = {}
    grams: dict = {}

    def _prune(self, W0, G, budget):
        GramRecorder.grams.setdefault(W0.shape, []).append(G.clone())
        return Magnitude()._prune(W0, G, budget)


def test_padding_stays_out_of_the_grams():
    """A padded batch gives the Grams of its real tokens only: those of the same sentences
    without padding."""
    bert = tiny_bert(1).double()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 100, (4, 10), generator=g)
    mask = torch.ones(4, 16, dtype=torch.long)
    mask[:, 10:] = 0
    padded = torch.cat([ids, torch.zeros(4, 6, dtype=torch.long)], 1)

    def grams(batch, **kw):
        GramRecorder.grams = {}
        prune_oneshot(copy.deepcopy(bert), [batch], GramRecorder(), target_density=0.5,
                      progress=False, include=["encoder.layer.0.attention.self.query"], **kw)
        return GramRecorder.grams[(32, 32)][0]

    clean = grams({"input_ids": ids})
    masked = grams({"input_ids": padded, "attention_mask": mask})
    assert torch.allclose(masked, clean, rtol=1e-9, atol=1e-12)
    unmasked = grams({"input_ids": padded, "attention_mask": mask},
                     token_mask_fn=lambda batch: None)                # every row, padding too
    assert not torch.allclose(unmasked, clean, rtol=1e-3)
    # a user's own mask function on a batch of another form
    custom = grams({"input_ids": padded, "attention_mask": mask},
                   token_mask_fn=lambda batch: batch["input_ids"] != 0)
    assert torch.allclose(custom, clean, rtol=1e-9, atol=1e-12)


def test_the_activation_cache_on_disk(tmp_path):
    model = tiny_gpt2()
    calib = token_batches(n=4)
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    prune_oneshot(a, calib, "sparsegpt", target_density=0.5, progress=False)
    prune_oneshot(b, calib, "sparsegpt", target_density=0.5, progress=False,
                  offload_dir=tmp_path / "cache", cache_memory_mb=0)
    assert max_diff(a, b) == 0.0
    assert os.listdir(tmp_path / "cache") == []  # the cache's files are gone


@pytest.mark.parametrize("kwargs, err, match", [
    ({"blocks": "transformer.nope"}, ValueError, "names no module"),
    ({"blocks": "transformer.wte"}, ValueError, "not a ModuleList"),
    ({"sequential": "blocks"}, ValueError, "sequential="),
    ({"sequential": "layer", "blocks": "transformer.h"}, ValueError, "blocks="),
    ({"cache_memory_mb": 10}, ValueError, "offload_dir"),
    ({"gram_precision": "half"}, ValueError, "gram_precision"),
    ({"token_mask_fn": 3}, TypeError, "token_mask_fn"),
    ({"token_mask_fn": lambda b: torch.ones(2, 2, 2)}, TypeError, "token_mask_fn"),
])
def test_refused_pipeline_options_leave_the_model_as_given(kwargs, err, match):
    model = tiny_gpt2(2)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(err, match=match):
        prune_oneshot(model, token_batches(), "magnitude", target_density=0.5, progress=False,
                      **kwargs)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_sequential_block_says_why_there_are_no_blocks():
    class Flat(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    with pytest.raises(ValueError, match="no chain of blocks"):
        prune_oneshot(Flat(), torch.randn(8, 4), "magnitude", target_density=0.5,
                      progress=False, sequential="block")


def test_a_budget_that_empties_a_layer_is_raised_with_a_warning():
    net = nn.Sequential(nn.Linear(50, 40), nn.ReLU(), nn.Linear(40, 3))
    with pytest.warns(UserWarning, match="no weight at all"):
        res = prune_oneshot(net, torch.randn(64, 50), "magnitude", target_density=1e-4,
                            progress=False)
    kept = {r["layer"]: r["kept"] for r in res.report.layers}
    assert kept["2"] == 3 and kept["0"] >= 1


RESUME_SCRIPT = textwrap.dedent("""
    import os, sys, torch, transformers, warnings
    warnings.filterwarnings("ignore")
    from dualdrop.nn import prune_oneshot
    from dualdrop.nn.oneshot.methods.sparsegpt import SparseGPT

    class Dies(SparseGPT):
        calls = 0
        def _prune(self, W0, G, budget):
            Dies.calls += 1
            if Dies.calls == int(os.environ.get("DIE_AT", "0")):
                os._exit(7)                       # a kill: no cleanup, no finally
            return super()._prune(W0, G, budget)

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=4, n_positions=64,
                                  vocab_size=100, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg)
    g = torch.Generator().manual_seed(1)
    calib = [{"input_ids": torch.randint(0, 100, (4, 16), generator=g)} for _ in range(3)]
    prune_oneshot(model, calib, Dies(), target_density=0.5, progress=False,
                  checkpoint_dir=sys.argv[1])
    torch.save({"state": model.state_dict(), "calls": Dies.calls}, sys.argv[2])
""")


def run_script(tmp_path, script, *args, die_at=0):
    path = tmp_path / "script.py"
    path.write_text(script)
    env = {**os.environ, "DIE_AT": str(die_at), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(path), *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_killed_run_resumes_after_its_last_finished_block(tmp_path):
    ck, out_a, out_b = tmp_path / "ck", tmp_path / "a.pt", tmp_path / "b.pt"
    p = run_script(tmp_path, RESUME_SCRIPT, ck, out_a, die_at=7)  # in block 1 (4 layers each)
    assert p.returncode == 7, p.stderr
    assert not out_a.exists()
    p = run_script(tmp_path, RESUME_SCRIPT, ck, out_a)
    assert p.returncode == 0, p.stderr
    resumed = torch.load(out_a, weights_only=True)
    assert resumed["calls"] == 8                       # block 0 was not pruned again
    p = run_script(tmp_path, RESUME_SCRIPT, tmp_path / "fresh", out_b)
    assert p.returncode == 0, p.stderr
    whole = torch.load(out_b, weights_only=True)
    assert whole["calls"] == 12
    for k, v in whole["state"].items():
        assert torch.equal(v, resumed["state"][k]), k


def test_a_checkpoint_dir_of_other_settings_is_refused(tmp_path):
    model, calib = tiny_gpt2(2), token_batches()
    prune_oneshot(copy.deepcopy(model), calib, "magnitude", target_density=0.5,
                  progress=False, checkpoint_dir=tmp_path)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="other settings"):
        prune_oneshot(model, calib, "magnitude", target_density=0.3, progress=False,
                      checkpoint_dir=tmp_path)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("make", [tiny_llama, tiny_gpt2])
def test_pruning_from_disk_equals_pruning_in_memory(make, tmp_path):
    model = make()
    model.save_pretrained(tmp_path / "src")
    calib = token_batches()
    ref = copy.deepcopy(model)
    prune_oneshot(ref, calib, "sparsegpt", target_density=0.5, progress=False)
    report = prune_oneshot_from_disk(tmp_path / "src", calib, "sparsegpt", tmp_path / "out",
                                     target_density=0.5, progress=False, cache_memory_mb=0)
    assert report.density == pytest.approx(0.5, abs=1e-3)
    back = type(model).from_pretrained(tmp_path / "out")
    assert max_diff(ref, back) == 0.0
    assert not (tmp_path / "out" / ".oneshot-progress").exists()
    assert (tmp_path / "out" / "oneshot_report.json").exists()


def test_from_disk_refuses_what_it_cannot_read(tmp_path):
    with pytest.raises(ValueError, match="not a folder"):
        prune_oneshot_from_disk(tmp_path / "nope", token_batches(), "magnitude",
                                tmp_path / "out", target_density=0.5)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no model.safetensors"):
        prune_oneshot_from_disk(tmp_path / "empty", token_batches(), "magnitude",
                                tmp_path / "out", target_density=0.5)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="cannot be read as safetensors"):
        prune_oneshot_from_disk(bad, token_batches(), "magnitude", tmp_path / "out",
                                target_density=0.5)
    with pytest.raises(ValueError, match="must differ"):
        prune_oneshot_from_disk(bad, token_batches(), "magnitude", bad, target_density=0.5)


DISK_SCRIPT = textwrap.dedent("""
    import os, sys, torch, warnings
    warnings.filterwarnings("ignore")
    from dualdrop.nn import prune_oneshot_from_disk
    from dualdrop.nn.oneshot.methods.sparsegpt import SparseGPT

    class Dies(SparseGPT):
        calls = 0
        def _prune(self, W0, G, budget):
            Dies.calls += 1
            if Dies.calls == int(os.environ.get("DIE_AT", "0")):
                os._exit(7)
            return super()._prune(W0, G, budget)

    g = torch.Generator().manual_seed(1)
    calib = [{"input_ids": torch.randint(0, 100, (4, 16), generator=g)} for _ in range(3)]
    prune_oneshot_from_disk(sys.argv[1], calib, Dies(), sys.argv[2], target_density=0.5,
                            progress=False, cache_memory_mb=0)
    print("calls", Dies.calls)
""")


@pytest.mark.slow
def test_a_killed_run_from_disk_resumes(tmp_path):
    model = tiny_llama()
    model.save_pretrained(tmp_path / "src")
    ref = copy.deepcopy(model)
    prune_oneshot(ref, token_batches(), "sparsegpt", target_density=0.5, progress=False)
    p = run_script(tmp_path, DISK_SCRIPT, tmp_path / "src", tmp_path / "out", die_at=12)
    assert p.returncode == 7, p.stderr
    p = run_script(tmp_path, DISK_SCRIPT, tmp_path / "src", tmp_path / "out")
    assert p.returncode == 0, p.stderr
    assert "calls 15" in p.stdout  # 22 layers: blocks 0-1 (14) were not pruned again
    back = type(model).from_pretrained(tmp_path / "out")
    assert max_diff(ref, back) == 0.0


DIST_SCRIPT = textwrap.dedent("""
    import os, sys, torch, transformers, warnings
    warnings.filterwarnings("ignore")
    import torch.distributed as dist
    from dualdrop.nn import prune_oneshot

    on = "RANK" in os.environ
    if on:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=100)
    model = transformers.LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(1)
    calib = [{"input_ids": torch.randint(0, 100, (4, 16), generator=g)} for _ in range(5)]
    rank = dist.get_rank() if on else 0
    refused = ""
    if on and sys.argv[3:] == ["shards"]:  # each rank its own shard, as a DistributedSampler
        calib = calib[rank::dist.get_world_size()]
        try:
            prune_oneshot(model, calib, sys.argv[2], target_density=0.5, progress=False)
        except ValueError as e:
            refused = str(e)
    res = prune_oneshot(model, calib, sys.argv[2], target_density=0.5, progress=False,
                        calibration_sharded=bool(refused))
    torch.save({"state": model.state_dict(), "rows": res.report.layers, "refused": refused},
               f"{sys.argv[1]}.{rank}.pt")
    if on:
        dist.destroy_process_group()
    # leave without the interpreter's teardown: torch 2.13's gloo threads now and then abort it
    # ("terminate called without an active exception", SIGABRT) after the work above is saved
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
""")


@pytest.mark.slow
@pytest.mark.parametrize("method, shards", [("sparsegpt", ""), ("admm", ""),
                                            ("sparsegpt", "shards")])
def test_two_gloo_processes_prune_as_one(tmp_path, method, shards):
    """Every rank given every batch, or (``shards``) each rank its own shard: refused without
    ``calibration_sharded=True`` (the ranks compare their batches), pruned as one process
    with it."""
    script = tmp_path / "dist.py"
    script.write_text(DIST_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, str(script), str(tmp_path / "one"), method], env=env,
                         capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr
    # --standalone: a free port for each run (a fixed port collides when xdist runs two of
    # these cases at once)
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node", "2", str(script), str(tmp_path / "two"), method,
                          *([shards] if shards else [])],
                         env=env, capture_output=True, text=True, timeout=600)
    assert two.returncode == 0, two.stderr[-6000:]
    ref = torch.load(tmp_path / "one.0.pt", weights_only=True)
    for rank in (0, 1):
        got = torch.load(tmp_path / f"two.{rank}.pt", weights_only=True)
        if shards:
            assert "give every rank every batch" in got["refused"]
            assert "rank 0: 3 batches" in got["refused"] and "rank 1: 2 batches" in got["refused"]
        else:
            assert got["refused"] == ""
        for k, v in ref["state"].items():
            assert torch.allclose(v, got["state"][k], rtol=1e-5, atol=1e-6), (rank, k)
        assert [r["layer"] for r in got["rows"]] == [r["layer"] for r in ref["rows"]]
        for a, b in zip(ref["rows"], got["rows"]):
            assert a["rows"] == b["rows"]  # every token counted once over the two ranks
            assert a["objective"] == pytest.approx(b["objective"], rel=1e-4, abs=1e-9)


def test_distributed_true_needs_a_process_group():
    with pytest.raises(ValueError, match="process group"):
        prune_oneshot(tiny_gpt2(1), token_batches(), "magnitude", target_density=0.5,
                      progress=False, distributed=True)


@pytest.mark.parametrize("calib, match", [
    (torch.randn(32, 7), r"forward failed on the first calibration batch \(a tensor \(32, 7\)"),
    (torch.randn(32, 6, dtype=torch.float64), "float64"),
    ([torch.randn(16, 6), torch.full((16, 6), float("nan"))], r"NaN or infinite values \(batch 1"),
    ([{"x": torch.randn(4, 6)}], "forward failed"),
])
def test_bad_calibration_data_is_named(calib, match):
    net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    before = copy.deepcopy(net.state_dict())
    with pytest.raises(ValueError, match=match):
        prune_oneshot(net, calib, "magnitude", target_density=0.5, progress=False)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())


def test_inputs_that_overflow_inside_the_model_name_the_layer():
    net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    with torch.no_grad():
        net[0].weight.fill_(1e38)
    before = copy.deepcopy(net.state_dict())
    with pytest.raises(ValueError, match="calibration inputs of 2 are not finite"):
        prune_oneshot(net, torch.rand(16, 6) + 1, "magnitude", target_density=0.5,
                      progress=False)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())


class TupleBlocks(nn.Module):
    """Blocks returning (hidden, extra) tuples, the model taking element 0 (the older
    Hugging Face convention), and a namedtuple-returning variant."""

    def __init__(self, named=False):
        super().__init__()
        from collections import namedtuple
        Out = namedtuple("Out", "hidden extra")

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)

            def forward(self, h, scale=1.0):
                y = torch.relu(self.fc(h)) * scale
                return Out(y, y.sum()) if named else (y, y.sum())

        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x, scale=0.5)[0]
        return self.head(x)


@pytest.mark.parametrize("named", [False, True])
def test_blocks_that_return_tuples(named):
    torch.manual_seed(0)
    a, b, ra, rb = pruned_pair(TupleBlocks(named), [torch.randn(16, 8) for _ in range(2)],
                               target_density=0.5)
    assert rb.report.pipeline["mode"] == "block"
    assert max_diff(a, b) == 0.0


@pytest.mark.parametrize("width", [5, 1023, 1024, 1500, 2048])
def test_the_block_triangle_gram_is_the_full_product(width):
    from dualdrop.nn.oneshot.calibration import add_gram, symmetric_gram

    g = torch.Generator().manual_seed(width)
    xs = [torch.randn(n, width, dtype=torch.float64, generator=g) for n in (7, 130)]
    S = torch.zeros(width, width, dtype=torch.float64)
    for x in xs:
        add_gram(S, x)
    G = symmetric_gram(S)
    ref = sum(x.T @ x for x in xs)
    assert torch.allclose(G, ref, rtol=1e-12, atol=1e-10)
    assert torch.equal(G, G.T)


def test_a_killed_runs_cache_files_are_removed_by_the_next_run(tmp_path):
    """The activation cache's folder of a process that is gone (a run killed mid-way) is removed
    when the next cache opens in the same offload_dir; a live process's folder is left."""
    from dualdrop.nn.oneshot.storage import ActivationCache

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / f"dualdrop-cache-{gone.pid}-abc"
    live = tmp_path / f"dualdrop-cache-{os.getppid()}-def"
    other = tmp_path / "mine"
    for d in (stale, live, other):
        d.mkdir()
        (d / "h000000.pt").write_bytes(b"x" * 10)
    cache = ActivationCache(tmp_path, memory_mb=0)
    cache.set(0, torch.ones(3))                      # beyond the limit: in a file
    assert not stale.exists() and live.exists() and other.exists()
    assert os.path.basename(cache.dir).startswith(f"dualdrop-cache-{os.getpid()}-")
    assert torch.equal(cache.get(0), torch.ones(3))
    cache.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "mine"])
