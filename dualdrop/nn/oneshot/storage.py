"""The one-shot pipeline's files: the activation cache between blocks (in memory up to a limit,
the rest in files) and the per-segment resume record (``checkpoint_dir``), used by
``pipeline.run`` and by ``from_disk.prune_oneshot_from_disk``."""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import torch

# ----------------------------------------------------------------------------------------------
# the activation cache


class ActivationCache:
    """The hidden state entering the current block, one tensor per calibration batch: in
    memory up to ``memory_mb`` (all of it when ``offload_dir`` is ``None``), the rest in files
    under ``offload_dir`` (written to a temporary name, then moved; read with
    ``weights_only=True``). Each cache's folder is named after its process; the folders a killed
    run left there (their process gone) are removed when the next cache opens."""

    def __init__(self, offload_dir=None, memory_mb=None):
        self.dir = None
        if offload_dir is not None:
            os.makedirs(offload_dir, exist_ok=True)
            _remove_stale_caches(offload_dir)
            self.dir = tempfile.mkdtemp(prefix=f"dualdrop-cache-{os.getpid()}-",
                                        dir=offload_dir)
        self.limit = (None if offload_dir is None else
                      float(memory_mb if memory_mb is not None else 256) * 2 ** 20)
        self.mem: dict[int, torch.Tensor] = {}
        self.on_disk: set = set()
        self.bytes = 0

    def _path(self, i):
        return os.path.join(self.dir, f"h{i:06d}.pt")

    def set(self, i: int, t: torch.Tensor) -> None:
        t = t.detach()
        old = self.mem.pop(i, None)
        if old is not None:
            self.bytes -= old.numel() * old.element_size()
        size = t.numel() * t.element_size()
        if self.limit is None or self.bytes + size <= self.limit:
            self.mem[i] = t
            self.bytes += size
            if i in self.on_disk:
                os.remove(self._path(i))
                self.on_disk.discard(i)
            return
        tmp = self._path(i) + ".tmp"
        torch.save(t.cpu() if t.device.type != "cpu" else t, tmp)
        os.replace(tmp, self._path(i))
        self.on_disk.add(i)

    def get(self, i: int, device=None) -> torch.Tensor:
        t = self.mem.get(i)
        if t is None:
            # mapped from the file, not copied into the heap: what the cache keeps in files
            # stays out of the process's anonymous memory, batch after batch
            t = torch.load(self._path(i), weights_only=True, mmap=True)
        return t if device is None else t.to(device)

    def close(self) -> None:
        self.mem.clear()
        self.bytes = 0
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def _remove_stale_caches(offload_dir) -> None:
    """Remove the cache folders of processes that no longer run (a run killed mid-way) from
    ``offload_dir``; folders of live processes (other ranks, other runs) are left alone."""
    for name in os.listdir(offload_dir):
        parts = name.split("-")
        if len(parts) < 4 or parts[:2] != ["dualdrop", "cache"] or not parts[2].isdigit():
            continue
        pid = int(parts[2])
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(offload_dir, name), ignore_errors=True)
        except (PermissionError, OSError):
            pass   # alive under another user, or unknowable: left alone


# ----------------------------------------------------------------------------------------------
# resume


class Resume:
    """Finished segments of a run in ``directory``: ``progress.json`` (the run's
    ``fingerprint``, the finished segments and their report rows) and one ``<segment>.pt`` of
    pruned weights per finished segment."""

    def __init__(self, directory, fingerprint: dict, store_weights=True):
        # True, False, or a predicate of the segment's name (whether its weights are stored)
        self.store_weights = store_weights if callable(store_weights) else (
            lambda segment, flag=bool(store_weights): flag)
        self.dir = os.fspath(directory)
        os.makedirs(self.dir, exist_ok=True)
        self.fingerprint = json.loads(json.dumps(fingerprint, default=str))
        self.path = os.path.join(self.dir, "progress.json")
        self.state = {"fingerprint": self.fingerprint, "done": {}}
        if os.path.exists(self.path):
            try:
                with open(self.path) as f:
                    state = json.load(f)
                ok = isinstance(state, dict) and isinstance(state.get("done"), dict)
            except (OSError, ValueError):
                ok = False
            if not ok:
                raise ValueError(f"checkpoint_dir={self.dir!r}: {self.path} is not a one-shot "
                                 "progress file (corrupt or from another tool); remove it or "
                                 "choose another checkpoint_dir")
            if state.get("fingerprint") != self.fingerprint:
                diff = sorted(k for k in set(self.fingerprint) | set(state.get("fingerprint", {}))
                              if self.fingerprint.get(k) != state.get("fingerprint", {}).get(k))
                raise ValueError(f"checkpoint_dir={self.dir!r} holds a run started with other "
                                 f"settings (they differ in {diff}); use another "
                                 "checkpoint_dir, or delete this one to start over")
            self.state = state

    def done(self, segment: str):
        return self.state["done"].get(segment)

    def load(self, segment: str, steps) -> list:
        if not self.store_weights(segment):  # kept elsewhere (the from-disk source's shards)
            return self.state["done"][segment]
        path = os.path.join(self.dir, f"{segment}.pt")
        try:
            saved = torch.load(path, weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unreadable file is one message
            raise ValueError(f"checkpoint_dir={self.dir!r}: {path} cannot be read "
                             f"({type(e).__name__}); delete the folder to start over") from None
        with torch.no_grad():
            for s in steps:
                for name, p in s.parameters():
                    if name not in saved or saved[name].shape != p.shape:
                        raise ValueError(f"checkpoint_dir={self.dir!r}: {path} has no weight "
                                         f"{name} of shape {tuple(p.shape)}; delete the folder "
                                         "to start over")
                    p.copy_(saved[name])
        return self.state["done"][segment]

    def save(self, segment: str, steps, rows: list) -> None:
        if self.store_weights(segment):
            tensors = {name: p.detach().cpu().clone() for s in steps
                       for name, p in s.parameters()}
            path = os.path.join(self.dir, f"{segment}.pt")
            torch.save(tensors, path + ".tmp")
            os.replace(path + ".tmp", path)
        self.state["done"][segment] = rows
        with open(self.path + ".tmp", "w") as f:
            json.dump(self.state, f, default=str)
        os.replace(self.path + ".tmp", self.path)
