"""Counter-based random numbers for the stochastic methods: fast, and reproducible from a key.

Why not torch's generator: on one CPU thread ``torch.rand`` needs ~2.7 ns per float (Mersenne
Twister, sequential state), which for the 266k weights of LeNet-300-100 is a third of a dense
training step, at every step. A *counter-based* generator (Salmon et al., "Parallel random
numbers: as easy as 1, 2, 3", SC 2011) computes the ``i``-th number as a pure function
``bits_i = mix(key + i * g)`` of a key and the index: no state to advance, every index
independent, so the loop has no dependence chain and its 64-bit integer arithmetic vectorizes
(~0.45 ns per float measured here, 6x faster). The mixing function is the finalizer of
SplitMix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014)
applied to the Weyl sequence ``key + i * g`` with ``g = 0x9E3779B97F4A7C15``, which is exactly
SplitMix64's output ``i + 1`` steps after a state ``key - g``; SplitMix64 passes BigCrush.

Keys. ``make_key(seed, stream, step)`` hashes three integers into one 64-bit key: ``seed`` is the
run's seed, ``stream`` tells apart the tensors drawn in one step (one id per layer and use), and
``step`` counts the draws (e.g. a layer's training forwards; ``dualdrop.nn._fused`` says how the
layers should keep it). A draw is a pure function of (key, index), so resuming a run exactly
needs nothing beyond that counter and the run's seed (no generator state in the checkpoint), and
two streams never share numbers unless their hashed keys land within ``n`` of each other in
``2^64`` (probability ~``n / 2^63``).

What comes out (CPU, float32/float64 tensors; bit-exact on every CPU, independent of the
tensor's shape and strides because indices follow the row-major order):

- ``uniform_(t, key)``: float32 ``(k + 1/2) 2^-23`` from the top 23 bits (float64:
  ``(k + 1/2) 2^-53`` from the top 53), so every value lies in the *open* interval (0, 1) and
  ``1 - u`` lies on the same grid (``logit(u)`` is exactly antisymmetric, never infinite).
- ``normal_(t, key)``: Box-Muller, ``r = sqrt(-2 log a)``, ``(r cos 2 pi b, r sin 2 pi b)``, with
  ``a`` in (0, 1] and ``b`` in [0, 1): in float32 the low 32 bits and the high 24 bits of one
  64-bit word (one hash per *pair* of normals), in float64 53 bits of two independent words.
  The first half of the flat output takes the cosines, the second half the sines. numba's
  scalar ``log``/``cos``/``sin`` do not vectorize on this machine (measured ~12x slower than
  torch's), so in float32 the cosine and sine are polynomials after a quarter-turn reduction
  (``cos_sin_2pi_f32``, error below 1e-7) inside the hashing loop and only the log is torch's
  (three passes in all); float64 uses torch's log, sqrt, cos and sin. Normals are therefore bit-exact on the same torch build
  and CPU, not necessarily across builds. Float32 normals are bounded by ``|z| <= sqrt(66 log 2)
  ~= 6.76`` (``P(|Z| > 6.76) ~= 1.4e-11``).

Other devices: on a non-CPU tensor both functions fall back to a ``torch.Generator`` on that
device seeded with the key (still reproducible from the key, but a different sequence than on
the CPU, and torch's ``uniform_`` may return exactly 0, so it is clamped into the open interval).
That path is untested on GPUs: no GPU is available to the project's test machines.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

_GOLDEN = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1


def _splitmix(z: int) -> int:
    """SplitMix64's finalizer on a Python int (for keys; the arrays use the numba twin)."""
    z &= _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def make_key(seed: int, stream: int = 0, step: int = 0) -> int:
    """The 64-bit key of draw number ``step`` of stream ``stream`` in a run seeded ``seed``.

    All three are nonnegative integers below ``2^64``; the result is a hash chain, so nearby
    arguments give unrelated keys.
    """
    for name, v in (("seed", seed), ("stream", stream), ("step", step)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an integer, got {type(v).__name__} {v!r}")
        if not 0 <= int(v) <= _M64:
            raise ValueError(f"{name} must be in [0, 2^64), got {v!r}")
    k = _splitmix(int(seed) + _GOLDEN)
    k = _splitmix(k ^ (int(stream) * _GOLDEN & _M64))
    return _splitmix(k ^ (int(step) * 0xD1B54A32D192ED03 & _M64))


def check_key(key) -> np.uint64:
    if isinstance(key, bool) or not isinstance(key, (int, np.integer)):
        raise TypeError(f"key must be an integer (see make_key), got {type(key).__name__}")
    if not 0 <= int(key) <= _M64:
        raise ValueError(f"key must be in [0, 2^64), got {key!r}")
    return np.uint64(int(key))


# ---- numba kernels ----------------------------------------------------------------------------
# The mixer is written inline in each loop (a tiny @njit helper inlines the same, but keeping the
# loops self-contained makes their vectorization easy to check).

@njit(cache=True, inline="always")
def bits64(key, i):
    """SplitMix64 output for index ``i`` under ``key`` (uint64 arithmetic wraps)."""
    z = key + np.uint64(i) * np.uint64(_GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True, inline="always")
def u01_f32(key, i):
    """Float32 uniform in (0, 1): ``(k + 1/2) 2^-23`` from the top 23 bits of ``bits64``."""
    k = bits64(key, i) >> np.uint64(41)
    return (np.float32(k) + np.float32(0.5)) * np.float32(1.0 / 8388608.0)


@njit(cache=True)
def _fill_uniform_f32(key, out):
    for i in range(out.size):
        out[i] = u01_f32(key, i)


@njit(cache=True)
def _fill_uniform_f64(key, out):
    for i in range(out.size):
        k = bits64(key, i) >> np.uint64(11)
        out[i] = (np.float64(k) + 0.5) * (1.0 / 9007199254740992.0)


@njit(cache=True, inline="always")
def cos_sin_2pi_f32(b):
    """``(cos 2 pi b, sin 2 pi b)`` for ``b`` in [0, 1), float32, as selects and polynomials that
    vectorize (numba's scalar cos/sin do not): ``4b = q + t`` with ``q`` the nearest integer,
    ``x = t pi/2`` in [-pi/4, pi/4], Taylor polynomials to ``x^9``/``x^10`` (truncation below
    3e-8), then the quarter-turn ``q`` swaps and negates."""
    f = np.float32
    t4 = b * f(4.0)
    q = np.floor(t4 + f(0.5))
    x = (t4 - q) * f(math.pi / 2.0)
    x2 = x * x
    s = x * (f(1.0) + x2 * (f(-1.0 / 6.0) + x2 * (f(1.0 / 120.0) + x2 * (
        f(-1.0 / 5040.0) + x2 * f(1.0 / 362880.0)))))
    c = f(1.0) + x2 * (f(-0.5) + x2 * (f(1.0 / 24.0) + x2 * (f(-1.0 / 720.0) + x2 * (
        f(1.0 / 40320.0) + x2 * f(-1.0 / 3628800.0)))))
    # quarter turns k: (cos, sin) -> (c, s), (-s, c), (-c, -s), (s, -c); signs from the bits of
    # k as arithmetic and two-way selects only (a four-way select chain did not vectorize)
    k = np.int32(q)
    odd = (k & np.int32(1)) != np.int32(0)
    sign_c = f(np.int32(1) - np.int32(2) * (((k + np.int32(1)) >> np.int32(1)) & np.int32(1)))
    sign_s = f(np.int32(1) - np.int32(2) * ((k >> np.int32(1)) & np.int32(1)))
    cos_ = sign_c * (s if odd else c)
    sin_ = sign_s * (c if odd else s)
    return cos_, sin_


@njit(cache=True, error_model="numpy")
def _box_muller_f32(key, a, cos_out, sin_out):
    """Pair ``i``: ``a[i]`` in (0, 1] from the low 32 bits (for the radius), the angle from the
    high 24 bits; ``cos_out[i]``, ``sin_out[i]`` (the radius is applied later). Outputs are
    separate arrays, not two halves indexed in one: the latter did not vectorize."""
    f = np.float32
    for i in range(a.size):
        z = bits64(key, i)
        lo = np.int64(z & np.uint64(0xFFFFFFFF))
        a[i] = f(lo) * f(2.0 ** -32) + f(2.0 ** -33)     # rounds to 1.0 at the top: log 0 = 0
        c, s = cos_sin_2pi_f32(f(z >> np.uint64(40)) * f(1.0 / 16777216.0))
        cos_out[i] = c
        sin_out[i] = s


@njit(cache=True, error_model="numpy")
def _apply_radius_f32(log_a, cos_out, sin_out):
    """``cos_out *= r``, ``sin_out *= r`` with ``r = sqrt(-2 log a)``."""
    for i in range(log_a.size):
        r = np.sqrt(np.float32(-2.0) * log_a[i])
        cos_out[i] *= r
        sin_out[i] *= r


@njit(cache=True, error_model="numpy")
def _fill_box_muller_f64(key, a, b):
    for i in range(a.size):
        z = bits64(key, i)
        a[i] = (np.float64(z >> np.uint64(11)) + 0.5) * (1.0 / 9007199254740992.0)
        z2 = bits64(key ^ np.uint64(0xA5A5A5A5A5A5A5A5), i)  # an independent word for the angle
        b[i] = np.float64(z2 >> np.uint64(11)) * (1.0 / 9007199254740992.0)


# ---- public API -------------------------------------------------------------------------------

_FLOAT32_OPEN = (2.0 ** -24, 1.0 - 2.0 ** -24)


def _device_generator(t: torch.Tensor, key: np.uint64) -> torch.Generator:
    return torch.Generator(device=t.device).manual_seed(int(key))


def _check_tensor(t, name="tensor") -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{name} must be float32 or float64, got {t.dtype}; draw into a float32 "
                        "tensor and convert")


def _flat_target(t: torch.Tensor):
    """A contiguous 1-d numpy view to fill, and the tensor to copy back from (or None)."""
    if t.is_contiguous():
        return t.detach().view(-1).numpy(), None
    buf = torch.empty(t.shape, dtype=t.dtype)
    return buf.view(-1).numpy(), buf


@torch.no_grad()
def uniform_(t: torch.Tensor, key: int) -> torch.Tensor:
    """Fill ``t`` in place with uniforms in the open interval (0, 1), a function of ``key`` and
    the row-major index only; returns ``t``. See the module docstring for the exact values."""
    _check_tensor(t)
    k = check_key(key)
    if t.device.type != "cpu":
        t.uniform_(generator=_device_generator(t, k))
        lo, hi = _FLOAT32_OPEN if t.dtype == torch.float32 else (2.0 ** -53, 1.0 - 2.0 ** -53)
        return t.clamp_(lo, hi)
    flat, buf = _flat_target(t)
    if flat.size:
        (_fill_uniform_f32 if t.dtype == torch.float32 else _fill_uniform_f64)(k, flat)
    if buf is not None:
        t.copy_(buf)
    return t


def uniform(shape, key: int, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """A new tensor of uniforms (see :func:`uniform_`)."""
    return uniform_(torch.empty(shape, dtype=dtype, device=device), key)


def normal_(t: torch.Tensor, key: int) -> torch.Tensor:
    """Fill ``t`` in place with standard normals (Box-Muller over counter-based uniforms, see the
    module docstring), a function of ``key`` and the row-major index only; returns ``t``."""
    _check_tensor(t)
    k = check_key(key)
    if t.device.type != "cpu":
        with torch.no_grad():
            return t.normal_(generator=_device_generator(t, k))
    n = t.numel()
    if n == 0:
        return t
    if not t.is_contiguous():  # fill a contiguous buffer (row-major indices), then copy
        buf = normal_(torch.empty(n, dtype=t.dtype), int(k))
        with torch.no_grad():
            return t.copy_(buf.view(t.shape))
    half = (n + 1) // 2
    o = t.detach().view(-1)
    if t.dtype == torch.float32:
        # three passes: numba (bits, angle, cos/sin), torch's vectorized log, numba (radius);
        # numpy views only (a few microseconds of overhead instead of tens: this runs for every
        # layer at every step of local reparameterization)
        o = o.numpy()
        a = np.empty(half, dtype=np.float32)
        sin_buf = o[half:] if n == 2 * half else np.empty(half, dtype=np.float32)
        _box_muller_f32(k, a, o[:half], sin_buf)
        _apply_radius_f32(torch.from_numpy(a).log_().numpy(), o[:half], sin_buf)
        if n != 2 * half:  # odd n: the last pair's sine is dropped
            o[half:] = sin_buf[: n - half]
        return t
    a, b = torch.empty(half, dtype=t.dtype), torch.empty(half, dtype=t.dtype)
    _fill_box_muller_f64(k, a.numpy(), b.numpy())
    r = a.log_().mul_(-2.0).sqrt_()
    b.mul_(2.0 * math.pi)
    torch.cos(b, out=o[:half])
    o[:half].mul_(r)
    if n > half:
        torch.sin(b[: n - half], out=o[half:])
        o[half:].mul_(r[: n - half])
    return t


def normal(shape, key: int, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """A new tensor of standard normals (see :func:`normal_`)."""
    return normal_(torch.empty(shape, dtype=dtype, device=device), key)
