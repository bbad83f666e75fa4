"""Local augmentation inside the jitted step (core/augment.py): crops of the padded image
and flips against numpy, the same key giving the same crops, its place in local training
(per-client keys, off unless asked), and CIFAR's per-channel normalisation."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_async as fa
from fedjax_async import config as config_lib
from fedjax_async.algorithms import fedavg
from fedjax_async.core import augment
from fedjax_async.core import client as client_lib
from fedjax_async.data import loader, natural

import natural_files as nf

PAD = 4


def numpy_crop_flip(x, offsets, flips, pad, fill):
  """torchvision's RandomCrop(H, padding=pad) then RandomHorizontalFlip, by hand."""
  b, h, w, c = x.shape
  out = np.empty_like(x)
  for i in range(b):
    canvas = np.empty((h + 2 * pad, w + 2 * pad, c), x.dtype)
    canvas[...] = np.asarray(fill if len(fill) else [0.0] * c, x.dtype)
    canvas[pad:pad + h, pad:pad + w] = x[i]
    oy, ox = offsets[i]
    crop = canvas[oy:oy + h, ox:ox + w]
    out[i] = crop[:, ::-1] if flips[i] else crop
  return out


def small_images(b=6, h=5, w=7, c=3):
  return np.arange(b * h * w * c, dtype=np.float32).reshape(b, h, w, c) / 100.0


@pytest.mark.parametrize("fill", [(), (-2.5, -2.4, -2.2)])
def test_crops_and_flips_are_those_of_the_padded_image(fill):
  x = small_images()
  key = jax.random.PRNGKey(3)
  offsets, flips = (np.asarray(a) for a in augment.draw(key, len(x), PAD))
  got = np.asarray(augment.crop_flip(jnp.asarray(x), key, PAD, fill))
  np.testing.assert_array_equal(got, numpy_crop_flip(x, offsets, flips, PAD, fill))
  assert flips.any() and (~flips).any()  # both cases met by this key


def test_offsets_cover_zero_to_twice_the_padding_and_flips_are_fair():
  offsets, flips = (np.asarray(a) for a in augment.draw(jax.random.PRNGKey(0), 20000, PAD))
  assert sorted(set(offsets.ravel().tolist())) == list(range(2 * PAD + 1))
  counts = np.bincount(offsets.ravel(), minlength=2 * PAD + 1) / offsets.size
  assert np.abs(counts - 1 / (2 * PAD + 1)).max() < 0.01
  assert abs(flips.mean() - 0.5) < 0.02


def test_the_same_key_gives_the_same_crops_and_another_key_others():
  x = jnp.asarray(small_images())
  a = augment.crop_flip(x, jax.random.PRNGKey(7), PAD)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(augment.crop_flip(
      x, jax.random.PRNGKey(7), PAD)))
  assert not np.array_equal(np.asarray(a), np.asarray(augment.crop_flip(
      x, jax.random.PRNGKey(8), PAD)))


def _train(cfg, key):
  """One client's local training of a linear model on 12 copies of one 6 x 6 x 3 image
  (the shuffle, drawn from ``key`` too, then changes nothing: only the augmentation's
  draws do)."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(np.repeat(rng.random((1, 6, 6, 3), np.float32), 12, 0))
  y = jnp.full(12, 2)
  apply_flat = lambda w, xb, train=False, rng=None: xb.reshape(len(xb), -1) @ w.reshape(108, 4)
  w0 = jnp.zeros(432)
  hp = {"lr": 0.5, "momentum": 0.0}
  return client_lib.train(apply_flat, fedavg.ALGORITHM, w0, {}, x, y, 12, key, hp,
                          cfg).w_end


def test_local_training_augments_with_the_clients_key_only_when_asked():
  base = client_lib.LocalConfig(batch_size=4, max_epochs=2, max_examples=12, momentum=False)
  aug = client_lib.LocalConfig(batch_size=4, max_epochs=2, max_examples=12, momentum=False,
                               augment="crop_flip")
  k1, k2 = jax.random.PRNGKey(1), jax.random.PRNGKey(2)
  plain = np.asarray(_train(base, k1))
  np.testing.assert_allclose(plain, np.asarray(_train(base, k2)), rtol=1e-5, atol=1e-7)
  with_aug = np.asarray(_train(aug, k1))
  assert np.abs(plain - with_aug).max() > 1e-3  # the step saw other images
  np.testing.assert_array_equal(with_aug, np.asarray(_train(aug, k1)))  # reproducible
  assert np.abs(with_aug - np.asarray(_train(aug, k2))).max() > 1e-3  # the key's own draws
  with pytest.raises(ValueError, match="local.augment"):
    client_lib.LocalConfig(augment="cutout")


def test_crop_flip_needs_images_and_the_flag_is_a_config_field():
  with pytest.raises(ValueError, match=r"local.augment=crop_flip: crops and flips images "
                     r"\[H, W, C\]; the data's examples have shape \(60,\)"):
    augment.check("crop_flip", (60,))
  cfg = fa.RunConfig().replace(augment="crop_flip")
  assert cfg.local.augment == "crop_flip"
  with pytest.raises(config_lib.ConfigError, match="local.augment"):
    config_lib.validate(fa.RunConfig().replace(augment="flip"))
  with pytest.raises(ValueError, match="local.augment=crop_flip"):  # synthetic: vectors
    fa.simulate(algorithm="fedavg", rounds=1, num_clients=4, augment="crop_flip")


def test_cifar_normalisation_is_per_channel_and_the_padding_is_black():
  x = small_images()
  mean = np.array([0.4914, 0.4822, 0.4465], np.float32)  # fedjax datasets/cifar100.py
  std = np.array([0.2023, 0.1994, 0.2010], np.float32)
  np.testing.assert_allclose(loader.normalized(x, "cifar"), (x - mean) / std, rtol=1e-6)
  np.testing.assert_allclose(loader.black("cifar", 3), -mean / std, rtol=1e-6)
  assert loader.black("none", 3) == ()
  with pytest.raises(ValueError, match="data.normalize=cifar: per-channel statistics of 3 "
                     "channels"):
    loader.normalized(x[..., :1], "cifar")


def test_a_cifar100_run_augments_reproducibly_on_normalised_images(tmp_path):
  """fedjax's CIFAR-100 files (x uint8, y), read with data.normalize=cifar, trained with
  local.augment=crop_flip: the same rounds twice, other rounds without augmentation."""
  rng = np.random.default_rng(0)
  written = {}
  for split, sizes in (("train", [5, 3, 4]), ("test", [4])):
    written[split] = [(rng.integers(0, 256, (n, 32, 32, 3)).astype(np.uint8),
                       rng.integers(0, 100, n).astype(np.int32)) for n in sizes]
    nf.write_fedjax(os.path.join(str(tmp_path), f"federated_cifar100_{split}.sqlite"),
                    [(str(i).encode(), {"x": x, "y": y})
                     for i, (x, y) in enumerate(written[split])])
  fed = fa.data.load("fedjax_cifar100", data_dir=str(tmp_path), normalize="cifar")
  mean = np.array([0.4914, 0.4822, 0.4465], np.float32)
  std = np.array([0.2023, 0.1994, 0.2010], np.float32)
  x1 = natural.padded_rows(fed, [1])[0][0, :3]
  np.testing.assert_allclose(x1, (written["train"][1][0] / 255.0 - mean) / std, rtol=1e-5,
                             atol=1e-6)
  flags = dict(dataset="fedjax_cifar100", data_dir=str(tmp_path), normalize="cifar", rounds=2,
               participation=1.0, delay_fraction=0, model="logreg", batch_size=2,
               local_epochs=1, algorithm="fedavg")
  w = lambda **kw: np.asarray(fa.simulate(**dict(flags, **kw)).runs["fedavg"].state.w)
  a, b, c = w(augment="crop_flip"), w(augment="crop_flip"), w()
  np.testing.assert_array_equal(a, b)
  assert np.abs(a - c).max() > 1e-4
