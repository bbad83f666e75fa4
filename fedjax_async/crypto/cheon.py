"""Cheon et al. (2019) Min (PAFed Alg. 1), in plaintext and under CKKS.

Alg. 1: x = (a+b)/2, y = (a-b)/2, m_0 = y^2, n_0 = y^2 - 1,
        m_{i+1} = m_i (1 - n_i/2), n_{i+1} = n_i^2 (n_i - 3)/4, return x - m_d.
m_d is Wilkes' iteration for sqrt(y^2) = |y| (exact as d -> infinity), so
x - m_d -> (a+b)/2 - |a-b|/2 = min(a, b).

Input scale (``scale`` c, not in the paper). Wilkes' iteration converges on y^2 in
[0, 1]; its error is largest near 0. DUCC's Min(s_j, 1/2), s_j = (cos + 1)/2, has
y = cos / 4, so y^2 only reaches 1/16. Running the iteration on (c y)^2 and dividing by c,
m_d = m_d(c y) / c, uses the range up to c = 4 (c = 2 for any a, b in [0, 1]); at c = 4
the error of one class weight is a quarter of c = 1's (4.71e-3 -> 1.18e-3 at d = 10;
the error falls 1.5x per iteration, so d = 10 with c = 4 beats d = 13 with c = 1,
1.40e-3: the same accuracy for 3 iterations, 6 levels, less).
Under CKKS c rides on constants the protocol multiplies by anyway (``secure_ducc``), so
it costs no depth. c = 1 is Alg. 1 as printed.

Homomorphically a constant multiplication costs a CKKS level, so the encrypted version
runs the same recurrence on the rescaled variables N_i = n_i / 2 and M_i = m_i / 2:

  N_0 = z^2 - 1/2,  M_0 = z^2        with z = y / sqrt 2,
  M_{i+1} = M_i (1 - N_i),           N_{i+1} = N_i^2 (N_i - 3/2),

which is algebraically identical (n_{i+1}/2 = (2N_i)^2 (2N_i - 3)/8 = N_i^2 (N_i - 3/2))
and needs only constant *additions* inside the loop: 2 levels per iteration (the cubic),
M running one level behind in parallel. Min = x - 2 M_d (2 M_d = M_d + M_d, free).
"""

from __future__ import annotations

import math

import numpy as np

from fedjax_async.crypto import ckks

SQRT2 = math.sqrt(2.0)


def cheon_abs_sq(y2, iterations: int):
  """m_d of Alg. 1 lines 2-6 from y^2 (plaintext; numpy or jax arrays)."""
  m = y2
  n = y2 - 1.0
  for _ in range(int(iterations)):
    m, n = m * (1.0 - n / 2.0), n * n * ((n - 3.0) / 4.0)
  return m


def cheon_min(a, b, iterations: int, scale: float = 1.0):
  """Alg. 1 in plaintext: approximates min(a, b) for a, b in [0, 1]; with ``scale`` c
  the iteration runs on (c y)^2 and m_d is divided by c (needs |c (a - b) / 2| <= 1)."""
  x = (a + b) / 2.0
  y = (a - b) / 2.0
  if scale == 1.0:
    return x - cheon_abs_sq(y * y, iterations)
  return x - cheon_abs_sq((scale * y) ** 2, iterations) / scale


def max_min_error(iterations: int, grid: int = 200_001, scale: float = 1.0) -> float:
  """max over s in [0, 1] of |cheon_min(s, 1/2) - min(s, 1/2)|: the error of one DUCC
  class weight (Eq. 13) with d = ``iterations`` (numerically, on a dense grid)."""
  s = np.linspace(0.0, 1.0, grid)
  return float(np.max(np.abs(cheon_min(s, 0.5, iterations, scale) - np.minimum(s, 0.5))))


def make_cheon_min(iterations: int, scale: float = 1.0):
  """A ``min_fn`` for ``fedjax_async.algorithms.pafed.ducc`` (jnp arrays in, out)."""

  def min_fn(a, b):
    return cheon_min(a, b, iterations, scale)

  min_fn.__name__ = (f"cheon_min_d{iterations}" if scale == 1.0 else
                     f"cheon_min_d{iterations}_x{scale:g}")
  return min_fn


# ------------------------------------------------------------------- homomorphic


def he_half_abs_from_z(ev: ckks.Evaluator, z, iterations: int):
  """Enc(M_d) = Enc(m_d / 2) from Enc(z), z = y / sqrt 2 (Alg. 1 lines 2-6, rescaled).

  Levels: z^2 (1) + 2 per iteration; the final N_d is not computed.
  """
  z2 = ev.square(z, what="Cheon Min: y^2 (Alg. 1 line 2)")
  m = z2
  n = ev.add_const(z2, -0.5)
  for i in range(int(iterations)):
    one_minus_n = ev.const_sub(1.0, n)
    m_next = ev.mult(m, one_minus_n, what=f"Cheon Min: m_{i + 1} (Alg. 1 line 4)")
    if i + 1 < iterations:
      n2 = ev.square(n, what=f"Cheon Min: n_{i}^2 (Alg. 1 line 5)")
      n = ev.mult(n2, ev.add_const(n, -1.5), what=f"Cheon Min: n_{i + 1} (Alg. 1 line 5)")
    m = m_next
  return m


def he_min(ev: ckks.Evaluator, a, b, iterations: int):
  """Enc(Min(a, b)) for all packed slots at once (Alg. 1); depth 2d + 1 from fresh inputs."""
  need = max(ckks.depth_used(a), ckks.depth_used(b)) + ckks.cheon_min_depth(iterations)
  if need > ev.depth:
    raise ckks.DepthError(
        f"Cheon Min with d={iterations} needs multiplicative depth {need} "
        f"(2d+1 = {ckks.cheon_min_depth(iterations)} from the inputs' level) but the CKKS "
        f"context has depth {ev.depth}")
  diff = ev.sub(a, b)
  z = ev.mult_const(diff, 1.0 / (2.0 * SQRT2), what="Cheon Min: y = (a-b)/2")
  x = ev.mult_const(ev.add(a, b), 0.5, what="Cheon Min: x = (a+b)/2")
  half_m = he_half_abs_from_z(ev, z, iterations)
  return ev.sub(x, ev.add(half_m, half_m))
