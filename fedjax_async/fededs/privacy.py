"""FedEDS's privacy figures (Fig. 3): PSNR, Gaussian-window SSIM, the encryption grid."""

from __future__ import annotations

import math
from typing import Dict, Sequence

import jax
import numpy as np

from fedjax_async import figures


Array = jax.Array


# ---------------------------------------------------------------- privacy / Fig. 3


def psnr(a, b, data_range: float = 1.0) -> float:
  """10 log10(L^2 / MSE) in dB over all pixels (inf for identical inputs)."""
  mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
  return float("inf") if mse == 0 else 10.0 * math.log10(data_range ** 2 / mse)


def _gaussian_window(size: int = 11, sigma: float = 1.5) -> np.ndarray:
  r = np.arange(size, dtype=np.float64) - (size - 1) / 2.0
  g = np.exp(-r ** 2 / (2 * sigma ** 2))
  return g / g.sum()


def _filter2(img: np.ndarray, g: np.ndarray) -> np.ndarray:
  """Separable 'valid' filtering of [H, W] with the 1-D window g on both axes."""
  rows = np.apply_along_axis(lambda v: np.convolve(v, g, mode="valid"), 1, img)
  return np.apply_along_axis(lambda v: np.convolve(v, g, mode="valid"), 0, rows)


def ssim(a, b, data_range: float = 1.0, win: int = 11, sigma: float = 1.5) -> float:
  """Mean SSIM (Wang et al., 2004) with a Gaussian window, K1 = 0.01, K2 = 0.03, over
  images [..., H, W, C] (every image and channel, then averaged); the window shrinks to
  the image's smaller side when needed (odd size).

  Args:
    a: the first images.
    b: the second, shaped alike.
    data_range: the pixels' range.
    win: the Gaussian window's size.
    sigma: its std.
  """
  a = np.asarray(a, np.float64)
  b = np.asarray(b, np.float64)
  if a.ndim == 2:
    a, b = a[None, ..., None], b[None, ..., None]
  elif a.ndim == 3:
    a, b = a[None], b[None]
  a = a.reshape((-1,) + a.shape[-3:])
  b = b.reshape((-1,) + b.shape[-3:])
  win = min(win, a.shape[1], a.shape[2])
  win -= (win + 1) % 2
  g = _gaussian_window(win, sigma)
  c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
  vals = []
  for i in range(a.shape[0]):
    for c in range(a.shape[-1]):
      x, y = a[i, ..., c], b[i, ..., c]
      mx, my = _filter2(x, g), _filter2(y, g)
      sxx = _filter2(x * x, g) - mx ** 2
      syy = _filter2(y * y, g) - my ** 2
      sxy = _filter2(x * y, g) - mx * my
      m = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx ** 2 + my ** 2 + c1) * (sxx + syy + c2))
      vals.append(m.mean())
  return float(np.mean(vals))


def privacy_report(originals, encrypted_with, encrypted_without,
                   data_range: float = 1.0) -> Dict[str, float]:
  """PSNR / SSIM of encrypted vs original images, with and without the stochastic layer
  (Fig. 3: lower = less recognisable)."""
  return {
      "psnr_with_layer": psnr(originals, encrypted_with, data_range),
      "ssim_with_layer": ssim(originals, encrypted_with, data_range),
      "psnr_without_layer": psnr(originals, encrypted_without, data_range),
      "ssim_without_layer": ssim(originals, encrypted_without, data_range),
  }


def save_encryption_grid(originals, encrypted, path: str, encrypted_without=None,
                         titles: Sequence[str] = ("original", "encrypted (layer on)",
                                                  "encrypted (layer off)"),
                         title: str = "") -> None:
  """PNG grid as Fig. 3: row 1 originals, row 2 encrypted (row 3: without the layer);
  ``title`` above it (the data set and setting).

  Args:
    originals: [n, H, W, C] the original images.
    encrypted: the same encrypted with the stochastic layer.
    path: the PNG to write.
    encrypted_without: the same encrypted without the layer (None: no third row).
    titles: the rows' labels.
    title: the figure's title (default: the images per row and the rows' labels).
  """
  rows = [np.asarray(originals), np.asarray(encrypted)]
  if encrypted_without is not None:
    rows.append(np.asarray(encrypted_without))
  n = rows[0].shape[0]
  fig = figures.new_figure((1.2 * n, 1.3 * len(rows)))
  axes = fig.subplots(len(rows), n, squeeze=False)
  for r, imgs in enumerate(rows):
    for c in range(n):
      ax = axes[r, c]
      img = np.clip(imgs[c], 0.0, 1.0)
      if img.ndim == 3 and img.shape[-1] == 1:
        ax.imshow(img[..., 0], cmap="gray", vmin=0, vmax=1)
      else:
        ax.imshow(img)
      ax.set_xticks([])
      ax.set_yticks([])
      if c == 0:
        ax.set_ylabel(titles[r], fontsize=7)
  fig.suptitle(title or f"{n} images per row: " + ", ".join(titles[:len(rows)]), fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
