"""The public API: ``fedjax_async.simulate`` (in memory, the CLI's defaults, files only when
asked) and the one algorithm registry."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fedjax_async as fa
from fedjax_async.core import divergence
import run_script

# Two rounds of FedAvg on the main job's data: a cheap run whose every field is a default.
FIELDS = dict(algorithm="fedavg", rounds=2)
pytestmark = pytest.mark.xdist_group("api")  # one worker: the compiled run is shared


def without_times(rows):
  return [{k: v for k, v in r.items() if k != "wall_time"} for r in rows]


@pytest.fixture(scope="module")
def in_memory(tmp_path_factory):
  cwd = os.getcwd()
  empty = tmp_path_factory.mktemp("cwd")
  os.chdir(empty)  # a run that wrote files by default would leave them here
  try:
    result = fa.simulate(**FIELDS)
  finally:
    os.chdir(cwd)
  return result, empty


def test_the_registry_holds_every_algorithm_module_on_the_engine_its_rule_names():
  """Each module of ``fedjax_async.algorithms`` exporting an ``ALGORITHM`` (with a module
  docstring) is registered under its name: a module left out of the registry fails here.
  ``names(engine)`` splits the registry by the engine each rule names."""
  import importlib  # pylint: disable=g-import-not-at-top
  import pkgutil  # pylint: disable=g-import-not-at-top
  exported = {}
  for m in pkgutil.iter_modules(fa.algorithms.__path__):
    module = importlib.import_module(f"fedjax_async.algorithms.{m.name}")
    if hasattr(module, "ALGORITHM"):
      assert (module.__doc__ or "").strip(), m.name
      exported[module.ALGORITHM.name] = module.ALGORITHM
  assert exported and set(exported) <= set(fa.algorithms.names())
  assert all(fa.algorithms.get(name) is alg for name, alg in exported.items())
  by_engine = {e: fa.algorithms.names(e) for e in fa.algorithms.ENGINES}
  for name in fa.algorithms.names():  # one contract; the registry's engine is its rule's
    alg = fa.algorithms.get(name)
    assert type(alg).__name__ == "Algorithm" and alg.name == name
    assert [e for e, ns in by_engine.items() if name in ns] == [alg.engine] == [
        fa.algorithms.engine_of(name)], name
  with pytest.raises(ValueError) as e:
    fa.algorithms.get("fedsgd")
  assert str(e.value) == ("unknown algorithm 'fedsgd'; choices: "
                          f"{', '.join(fa.algorithms.names())}")


def test_simulate_writes_nothing_unless_asked_and_returns_rows_state_and_table(in_memory):
  result, cwd = in_memory
  assert os.listdir(cwd) == []
  run = result.runs["fedavg"]
  assert [r["round"] for r in run.rows] == [1, 2]  # row r: the model after r rounds
  assert run.summary["final_accuracy"] == run.rows[-1]["test_accuracy"]
  assert "| fedavg |" in result.table() and result.figure is None
  # The state is the final model: its accuracy on the test set, recomputed here with the
  # model's apply and a plain argmax, is the last row's.
  from fedjax_async.rounds import experiment  # pylint: disable=g-import-not-at-top
  fed = experiment.load_data(result.config)
  logits = np.asarray(run.model[2](run.state.w, fed.test_x, train=False))
  assert np.mean(np.argmax(logits, -1) == fed.test_y) == pytest.approx(
      run.rows[-1]["test_accuracy"], abs=1e-6)


def test_simulate_and_the_cli_share_their_defaults(in_memory, tmp_path):
  """The same fields from Python and from experiments/run.py give the same rounds."""
  out = subprocess.run(
      [sys.executable, run_script.RUN, "--quiet", f"--output_dir={tmp_path}",
       *[f"--{k}={v}" for k, v in FIELDS.items()]],
      env=run_script.env(), capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  with open(tmp_path / "fedavg" / "metrics.jsonl") as f:
    cli_rows = [json.loads(line) for line in f]
  assert without_times(cli_rows) == without_times(
      json.loads(json.dumps(in_memory[0].runs["fedavg"].rows)))


def test_simulate_writes_the_clis_files_when_given_an_output_dir(tmp_path):
  result = fa.simulate(fa.RunConfig().replace(**dict(FIELDS, algorithm="fedavg,fedprox")),
                       output_dir=str(tmp_path), tensorboard=False, rounds=1)
  assert sorted(os.listdir(tmp_path)) == ["comparison.csv", "comparison.md", "curves.png",
                                          "fedavg", "fedprox"]
  with open(tmp_path / "fedprox" / "summary.json") as f:
    assert json.load(f)["final_accuracy"] == result.runs["fedprox"].summary["final_accuracy"]


def test_simulate_refuses_a_bad_field_by_name():
  with pytest.raises(ValueError, match=r"^run\.rounds: must be >= 1, got 0"):
    fa.simulate(rounds=0)
  with pytest.raises(ValueError,
                     match=r"^output\.resume: continues the run in output\.output_dir"):
    fa.simulate(resume=True)


class Recorder(fa.Callback):
  """A user's callback: what it was given after each chunk; stops the run after
  ``stop_at`` rounds."""

  def __init__(self, stop_at=None):
    self.calls, self.stop_at = [], stop_at

  def after_chunk(self, loop, state, rows):
    self.calls.append(([r["round"] for r in rows], int(state.round), len(loop.rows)))
    if self.stop_at is not None and int(state.round) >= self.stop_at:
      loop.stop()


def test_a_callback_sees_every_chunk_and_can_stop_the_run_with_its_checkpoint(tmp_path):
  seen = Recorder()
  result = fa.simulate(algorithm="fedavg", rounds=5, rounds_per_call=2, callbacks=[seen],
                       quiet=True)
  assert seen.calls == [([1, 2], 2, 2), ([3, 4], 4, 4), ([5], 5, 5)]
  stop = Recorder(stop_at=4)
  # Early stopping keeps the result: the rows and state up to the stop, a summary saying
  # so, the checkpoint of round 4 on disk.
  early = fa.simulate(algorithm="fedavg", rounds=5, rounds_per_call=2, callbacks=[stop],
                      quiet=True, output_dir=str(tmp_path), checkpoint_every=100,
                      tensorboard=False).runs["fedavg"]
  with open(tmp_path / "fedavg" / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  four = without_times(json.loads(json.dumps(result.runs["fedavg"].rows[:4])))
  assert without_times(rows) == four == without_times(json.loads(json.dumps(early.rows)))
  assert int(early.state.round) == 4 and early.summary["stopped_early_at_round"] == 4
  assert early.summary["final_accuracy"] == early.rows[-1]["test_accuracy"]
  assert json.load(open(tmp_path / "fedavg" / "summary.json"))["stopped_early_at_round"] == 4
  assert os.path.isdir(tmp_path / "fedavg" / "checkpoints" / "4")
  from fedjax_async import interrupts  # pylint: disable=g-import-not-at-top
  assert not interrupts.pending()  # the stop was that run's: later runs are not stopped


def test_the_example_script_runs():
  out = subprocess.run([sys.executable, os.path.join(run_script.ROOT, "examples",
                                                     "quickstart.py"), "2"],
                       env=run_script.env(), capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "| pafed |" in out.stdout and "| fedavg |" in out.stdout, out.stdout


# The virtual clock from Python: a small FedBuff run (6 clients, 2 in flight, 3 groups a
# compiled call); every other field is AsyncRunConfig's default, the CLI's.
CLOCK = dict(algorithm="fedbuff", num_clients=6, concurrency=2, num_updates=6, buffer_k=2,
             eval_every=2, groups_per_call=3, group_size=1)


def test_the_virtual_clock_from_python_writes_nothing_and_equals_the_cli(tmp_path):
  cwd = os.getcwd()
  (tmp_path / "cwd").mkdir()
  os.chdir(tmp_path / "cwd")
  try:
    result = fa.simulate(fa.AsyncRunConfig(), **CLOCK)
  finally:
    os.chdir(cwd)
  assert os.listdir(tmp_path / "cwd") == []
  run = result.runs["fedbuff"]
  assert len(run.rows) == 12 and run.rows[-1]["arrival_version"] == 5  # K=2 per update
  assert "| fedbuff |" in result.table()
  out = subprocess.run(
      [sys.executable, os.path.join(run_script.ROOT, "experiments", "async_family.py"),
       f"--output_dir={tmp_path / 'cli'}", *[f"--{k}={v}" for k, v in CLOCK.items()]],
      env=run_script.env(), capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  with open(tmp_path / "cli" / "fedbuff" / "metrics.jsonl") as f:
    cli_rows = [json.loads(line) for line in f]
  assert without_times(cli_rows) == without_times(json.loads(json.dumps(run.rows)))
  # state.w is the final global model: its test accuracy, recomputed with a plain argmax,
  # is the last evaluated row's
  from fedjax_async.asynchronous import experiment as async_experiment  # pylint: disable=g-import-not-at-top
  fed, (_, _, apply_flat, _, _) = async_experiment.load(result.config)
  logits = np.asarray(apply_flat(run.state.w, fed.test_x, train=False))
  assert np.mean(np.argmax(logits, -1) == fed.test_y) == pytest.approx(
      run.rows[-1]["test_accuracy"], abs=1e-6)


class GroupRecorder(fa.Callback):
  """Records each chunk's arrival versions; stops after the first chunk when asked."""

  def __init__(self, stop=False):
    self.calls, self.stop = [], stop

  def after_chunk(self, loop, state, rows):
    self.calls.append([r["arrival_version"] for r in rows])
    if self.stop:
      loop.stop()


def test_a_virtual_clock_run_stopped_by_a_callback_resumes_to_the_uninterrupted_rows(
    tmp_path):
  seen = GroupRecorder()
  whole = fa.simulate(fa.AsyncRunConfig(), callbacks=[seen], **CLOCK)
  # 12 arrivals (K=2 per update), one a group on CPU, 3 groups a compiled call
  assert [len(c) for c in seen.calls] == [3, 3, 3, 3]
  fields = dict(CLOCK, output_dir=str(tmp_path), checkpoint_every=1)
  with pytest.raises(fa.Interrupted):
    fa.simulate(fa.AsyncRunConfig(), callbacks=[GroupRecorder(stop=True)], **fields)
  with open(tmp_path / "fedbuff" / "metrics.jsonl") as f:
    assert len(f.readlines()) == len(seen.calls[0])  # the first chunk's arrivals
  rest = GroupRecorder()
  resumed = fa.simulate(fa.AsyncRunConfig(), callbacks=[rest], resume=True, **fields)
  assert rest.calls == seen.calls[1:]  # from the checkpoint after the first chunk
  assert without_times(resumed.runs["fedbuff"].rows) == without_times(
      whole.runs["fedbuff"].rows)
  np.testing.assert_array_equal(resumed.runs["fedbuff"].state.w,
                                whole.runs["fedbuff"].state.w)
  with pytest.raises(ValueError, match=r"^clock\.concurrency: must be in \[1, "
                     r"data\.num_clients=6\], got 7"):
    fa.simulate(fa.AsyncRunConfig(), **dict(CLOCK, concurrency=7))


def test_a_diverging_virtual_clock_run_keeps_its_finite_arrivals_and_is_left_out(tmp_path):
  """FedBuff with eta_s = 1e38: after its second server step (group 3) the test loss is
  infinite. The host loop's divergence check writes the arrivals before that group, also
  those of its own compiled call (groups 2-3), keeps the checkpoint of the last finite
  state (group 2) and leaves the run out of the result, naming the group."""
  result = fa.simulate(fa.AsyncRunConfig(), **dict(CLOCK, groups_per_call=2, server_lr=1e38,
                                                   lr=0.05, momentum=0.0,
                                                   output_dir=str(tmp_path),
                                                   checkpoint_every=1))
  assert result.runs == {} and result.diverged == {"fedbuff (seed 0)": (
      "group 3: the test loss is inf (the global model is finite); the first non-finite "
      "client result: client 4 (local loss inf, ||Delta|| 0) in group 2; no client was far "
      "out before it, nor any of its group finite: the likelier cause is the model they "
      f"started from; {divergence.SERVER_ADVICE}")}
  with open(tmp_path / "fedbuff" / "metrics.jsonl") as f:
    assert [json.loads(line)["group"] for line in f] == [0, 1, 2]
  assert os.listdir(tmp_path / "fedbuff" / "checkpoints") == ["2"]


def _arrays(seed=0, n=400, d=6, k=3):
  rng = np.random.default_rng(seed)
  w = rng.normal(size=(d, k))
  x = rng.normal(size=(n, d)).astype(np.float32)
  tx = rng.normal(size=(100, d)).astype(np.float32)
  return x, np.argmax(x @ w, 1), tx, np.argmax(tx @ w, 1)


def test_own_arrays_federate_with_every_example_once():
  x, y, tx, ty = _arrays()
  fed = fa.data.from_arrays(x, y, (tx, ty), num_clients=8, partition="dirichlet", alpha=0.3)
  assert fed.x.shape[0] == 8 and int(fed.counts.sum()) == len(y) and fed.num_classes == 3
  got = sorted(tuple(r) for i in range(8) for r in fed.x[i, :fed.counts[i]])
  assert got == sorted(tuple(r) for r in x)  # each example on exactly one client
  clients = [(x[:10], y[:10]), (x[10:25], y[10:25])]
  own = fa.data.from_clients(clients, (tx, ty))
  assert list(own.counts) == [10, 15]
  np.testing.assert_array_equal(own.x[1, :15], x[10:25])
  np.testing.assert_array_equal(own.y[0, :10], y[:10])
  with pytest.raises(ValueError, match=r"^x and y: 400 examples against 399 labels"):
    fa.data.from_arrays(x, y[:-1], (tx, ty), num_clients=8)
  with pytest.raises(ValueError, match=r"^test: expected a pair"):
    fa.data.from_arrays(x, y, tx, num_clients=8)


def test_own_data_and_flax_module_through_simulate():
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  x, y, tx, ty = _arrays()
  fed = fa.data.from_arrays(x, y, (tx, ty), num_clients=8, partition="dirichlet", alpha=0.5)

  class Tiny(nn.Module):  # no ``train`` argument: simulate wraps it
    @nn.compact
    def __call__(self, h):
      return nn.Dense(3)(nn.relu(nn.Dense(8)(h)))

  module = Tiny()
  run = fa.simulate(algorithm=["fedavg"], data=fed, model=module, rounds=3,
                    quiet=True).runs["fedavg"]
  assert run.summary["model"] == "Tiny" and run.summary["dataset"] == "arrays"
  # the final flat model, unravelled into the module's own parameters, scores the last row
  params = run.model[2].params(run.state.w)
  logits = module.apply({"params": params["inner"]}, tx)
  assert np.mean(np.argmax(np.asarray(logits), -1) == ty) == pytest.approx(
      run.rows[-1]["test_accuracy"], abs=1e-6)

  with pytest.raises(ValueError, match=r"^data: expected a FederatedData"):
    fa.simulate(algorithm="fedavg", data=[(x, y)], rounds=1, quiet=True)


def test_a_user_algorithm_with_its_own_hyperparameter_equals_its_builtin_twin():
  """FedAvg rewritten by a user, its step size a declared hyper-parameter ``beta``:
  with beta = b it must follow the built-in FedAvg at server_lr = b round for round."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from fedjax_async.algorithms import base  # pylint: disable=g-import-not-at-top

  def server_update(w, server_state, uploads, arrivals, round_index, hp):
    del round_index
    n = jnp.where(arrivals.valid, arrivals.num_examples, 0.0)
    mean = jnp.einsum("k,kd->d", n, uploads) / jnp.sum(n)
    return w + hp["beta"] * mean, server_state, {}

  mine = base.Algorithm(name="my_fedavg", local_penalty=base.no_penalty,
                        client_final=base.delta_upload, server_update=server_update,
                        hparams=(base.HParam("beta", 0.5),))
  common = dict(rounds=3, quiet=True, delay_fraction=0.0)
  default = fa.simulate(algorithm=mine, **common).runs["my_fedavg"]
  assert "my_fedavg" in fa.algorithms.names("rounds")
  quarter = fa.simulate(algorithm="my_fedavg", hp={"beta": 0.25}, **common).runs["my_fedavg"]
  for run, lr in ((default, 0.5), (quarter, 0.25)):
    twin = fa.simulate(algorithm="fedavg", server_lr=lr, **common).runs["fedavg"]
    np.testing.assert_allclose(np.asarray(run.state.w), np.asarray(twin.state.w), atol=1e-5)
  assert not np.allclose(np.asarray(default.state.w), np.asarray(quarter.state.w))
  with pytest.raises(ValueError, match=r"^algorithm\.hp: gamma: not a hyper-parameter of "
                     r"my_fedavg \(declared: beta\)"):
    fa.simulate(algorithm="my_fedavg", hp="gamma=1", **common)
  with pytest.raises(ValueError, match="the name 'fedavg' is taken"):
    fa.algorithms.register(base.Algorithm(name="fedavg", local_penalty=base.no_penalty,
                                          client_final=base.delta_upload,
                                          server_update=server_update))


def _user_fedavg(name: str, step: str):
  """A user's FedAvg whose server step size is its own hyper-parameter ``step`` (default
  1): w + step * (the arrivals' deltas averaged with weights n_i)."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from fedjax_async.algorithms import base  # pylint: disable=g-import-not-at-top

  def server_update(w, server_state, uploads, arrivals, round_index, hp):
    del round_index
    n = jnp.where(arrivals.valid, arrivals.num_examples, 0.0)
    return w + hp[step] * jnp.einsum("k,kd->d", n, uploads) / jnp.sum(n), server_state, {}

  return base.Algorithm(name=name, local_penalty=base.no_penalty,
                        client_final=base.delta_upload, server_update=server_update,
                        hparams=(base.HParam(step, 1.0),))


def test_seeds_and_an_own_hyperparameter_swept_as_one_computation_equal_single_runs():
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  x, y, tx, ty = _arrays(1)
  fed = fa.data.from_arrays(x, y, (tx, ty), num_clients=8, partition="dirichlet", alpha=0.5)

  class Tiny(nn.Module):
    @nn.compact
    def __call__(self, h):
      return nn.Dense(3)(nn.relu(nn.Dense(8)(h)))

  mine = _user_fedavg("swept_fedavg", "beta")
  common = dict(algorithm=mine, data=fed, model=Tiny(), rounds=3, quiet=True)
  swept = fa.simulate(seeds=[0, 1], sweep={"beta": [0.5, 1.0]}, **common)
  assert sorted(swept.runs) == [f"swept_fedavg/beta={b}_seed={s}" for b in ("0.5", "1")
                                for s in (0, 1)]
  for (beta, seed) in ((0.5, 1), (1.0, 0)):
    single = fa.simulate(seed=seed, hp={"beta": beta}, **common).runs["swept_fedavg"]
    run = swept.runs[f"swept_fedavg/beta={beta:g}_seed={seed}"]
    assert run.summary["setting"] == {"beta": beta}
    np.testing.assert_allclose(np.asarray(run.state.w), np.asarray(single.state.w), atol=1e-6)
    assert [r["test_accuracy"] for r in run.rows] == pytest.approx(
        [r["test_accuracy"] for r in single.rows], abs=1e-6)


def test_both_engines_results_read_into_records(in_memory):
  result, _ = in_memory
  records = result.to_records()
  assert len(records) == len(result.runs["fedavg"].rows) == 2
  assert [r["round"] for r in records] == [1, 2] and {r["run"] for r in records} == {"fedavg"}
  assert records[-1]["test_accuracy"] == result.runs["fedavg"].rows[-1]["test_accuracy"]
  (summary,) = result.summary_records()
  assert summary["final_accuracy"] == result.runs["fedavg"].summary["final_accuracy"]
  tree = result.final_model()
  flat = np.concatenate([np.ravel(a) for a in __import__("jax").tree.leaves(tree)])
  assert sorted(flat) == pytest.approx(sorted(np.asarray(result.runs["fedavg"].state.w)))
  clock = fa.simulate(fa.AsyncRunConfig(), algorithm="fedasync", num_updates=6, seeds="0,1")
  recs = clock.to_records()
  assert {r["run"] for r in recs} == {"fedasync/seed=0", "fedasync/seed=1"}
  assert len(recs) == sum(len(r.rows) for runs in clock.by_seed.values()
                          for r in runs.values())


def test_a_second_identical_simulate_call_compiles_nothing(capsys):
  from fedjax_async.rounds import engine  # pylint: disable=g-import-not-at-top
  traces = []
  for quiet in (True, True, False, False):
    before = engine.TRACES[0]
    fa.simulate(algorithm="fedavg", rounds=4, rounds_per_call=2, quiet=quiet, seed=7)
    traces.append(engine.TRACES[0] - before)
  # (at most one trace first: an earlier test in this process may have made it; progress
  # lines are a program of their own)
  assert traces[0] <= 1 and traces[2] <= 1 and traces[1] == traces[3] == 0, traces
  out = capsys.readouterr().out
  assert out.count("compiling the round program") <= 1  # the last run reused it


class _WithBatchNorm(__import__("flax").linen.Module):
  """A user's module with batch statistics (a mutable collection)."""

  @__import__("flax").linen.compact
  def __call__(self, h, train: bool = False):
    import flax.linen as nn  # pylint: disable=g-import-not-at-top
    h = nn.Dense(8)(h)
    h = nn.BatchNorm(use_running_average=not train, momentum=0.5)(h)
    return nn.Dense(3)(nn.relu(h))


def test_batch_statistics_follow_the_running_average_of_the_local_minibatches():
  """One local step on one minibatch of 20 examples: the BatchNorm mean becomes
  m * 0 + (1 - m) * mean(x W + b) and the variance m * 1 + (1 - m) * var, from the initial
  kernel (numpy, by hand); the parameters take plain SGD on the training-mode loss; and
  evaluation uses the running statistics."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from fedjax_async.core import client as client_lib  # pylint: disable=g-import-not-at-top
  from fedjax_async import models  # pylint: disable=g-import-not-at-top
  from fedjax_async.algorithms import fedavg  # pylint: disable=g-import-not-at-top
  module = _WithBatchNorm()
  _, w0, apply_flat = models.user_model(module, (6,), 0)
  x, y, _, _ = _arrays(n=20)
  cfg = client_lib.LocalConfig(batch_size=20, max_epochs=1, max_examples=20)
  hp = {"lr": 0.1, "momentum": 0.0}
  res = client_lib.train(apply_flat, fedavg.ALGORITHM, w0, {}, x, y, jnp.int32(20),
                         jax.random.PRNGKey(0), hp, cfg)
  v0, v1 = apply_flat.params(w0), apply_flat.params(res.w_end)
  dense = v0["params"]["Dense_0"]
  h = x @ np.asarray(dense["kernel"]) + np.asarray(dense["bias"])
  stats = v1["batch_stats"]["BatchNorm_0"]
  np.testing.assert_allclose(stats["mean"], 0.5 * h.mean(0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats["var"], 0.5 + 0.5 * h.var(0), rtol=1e-5, atol=1e-6)

  def loss(params):  # the training-mode loss, batch statistics from the minibatch
    logits, _ = module.apply({"params": params, "batch_stats": v0["batch_stats"]}, x,
                             train=True, mutable=["batch_stats"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  g = jax.grad(loss)(v0["params"])
  want = jax.tree.map(lambda p, gp: p - 0.1 * gp, v0["params"], g)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(v1["params"])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  # evaluation: the running statistics, not the batch's
  ev = module.apply({"params": v1["params"], "batch_stats": v1["batch_stats"]}, x[:3])
  np.testing.assert_allclose(apply_flat(res.w_end, x[:3]), ev, rtol=1e-5, atol=1e-6)


def test_own_data_batch_norm_module_and_swept_algorithm_on_every_engine(tmp_path):
  """The issue's scenario without internals: numpy arrays federated by Dirichlet, a user
  Flax module with BatchNorm and a user algorithm with its own hyper-parameter, swept over
  two values and two seeds as one computation; the same module and data on the virtual
  clock; FedEDS through ``fa.simulate``; every Result read into records the same way."""
  from fedjax_async.fededs import config as fededs_config  # pylint: disable=g-import-not-at-top
  x, y, tx, ty = _arrays(2)
  fed = fa.data.from_arrays(x, y, (tx, ty), num_clients=8, partition="dirichlet", alpha=0.5)

  mine = _user_fedavg("bn_fedavg", "eta")
  result = fa.simulate(algorithm=mine, data=fed, model=_WithBatchNorm(), rounds=3,
                       quiet=True, seeds=[0, 1], sweep={"eta": [0.0, 1.0]})
  assert len(result.runs) == 4
  frozen = result.runs["bn_fedavg/eta=0_seed=0"]
  moved = result.runs["bn_fedavg/eta=1_seed=0"]
  # eta = 0: the server never moves, batch statistics included (the initial 0 and 1)
  stats = result.final_model("bn_fedavg/eta=0_seed=0")["batch_stats"]["BatchNorm_0"]
  assert np.all(np.asarray(stats["mean"]) == 0) and np.all(np.asarray(stats["var"]) == 1)
  moved_stats = result.final_model("bn_fedavg/eta=1_seed=0")["batch_stats"]["BatchNorm_0"]
  assert np.all(np.asarray(moved_stats["var"]) != 1)  # averaged clients' statistics
  assert frozen.summary["final_accuracy"] != moved.summary["final_accuracy"]
  clock = fa.simulate(fa.AsyncRunConfig(), algorithm="fedasync", data=fed,
                      model=_WithBatchNorm(), num_updates=6)
  clock_stats = clock.final_model()["batch_stats"]["BatchNorm_0"]
  assert np.all(np.asarray(clock_stats["var"]) != 1)
  fededs = fa.simulate(fededs_config.FedEDSRunConfig().replace(
      **{**fededs_config.QUICK, "variants": "base", "rounds": 2, "train_subset": 200,
         "test_subset": 100, "privacy": False, "utility_epochs": 0,
         "output_dir": str(tmp_path / "fededs")}))
  for res, engine_keys in ((result, {"round"}), (clock, {"event", "virtual_time"}),
                           (fededs, {"round"})):
    records, summaries = res.to_records(), res.summary_records()
    assert records and len(records) == sum(len(r.rows) for r in res.all_runs().values())
    assert all(engine_keys <= set(r) and {"run", "algorithm"} <= set(r) for r in records)
    for s in summaries:  # one shape of summary on every engine
      assert {"final_accuracy", "best_accuracy", "last10_mean_accuracy",
              "average_best_accuracy"} <= set(s), s
      assert s["best_accuracy"] >= s["final_accuracy"]
  assert [r["round"] for r in fededs.to_records()] == [1, 2]  # counted from 1 everywhere


_CACHED_RUN = ("import fedjax_async as fa, jax; "  # (with its progress lines, as the CLI)
               "fa.simulate(algorithm='fedavg', rounds=2); "
               "print('cache_dir=' + str(jax.config.jax_compilation_cache_dir))")


def test_a_second_process_loads_the_round_program_from_the_persistent_cache(tmp_path):
  """JAX's persistent compilation cache is on by default: the first process writes the
  compiled round program to the cache folder (a run printing its progress too: its
  program has no host callback, which would keep it off the disk), a second identical
  one adds nothing (every program a cache hit); FEDJAX_ASYNC_COMPILATION_CACHE=0 turns it
  off."""
  cache = tmp_path / "cache"
  env = {k: v for k, v in os.environ.items()  # not the test run's own cache (conftest)
         if k not in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")}
  env["FEDJAX_ASYNC_COMPILATION_CACHE"] = str(cache)
  run = lambda e: subprocess.run([sys.executable, "-c", _CACHED_RUN], env=e,
                                 capture_output=True, text=True, cwd=tmp_path, timeout=300)
  first = run(env)
  assert first.returncode == 0, first.stderr[-2000:]
  assert f"cache_dir={cache}" in first.stdout
  written = sorted(os.listdir(cache))
  assert any("traced_chunk" in f for f in written), written
  second = run(env)
  assert second.returncode == 0, second.stderr[-2000:]
  assert sorted(os.listdir(cache)) == written
  off = run({**env, "FEDJAX_ASYNC_COMPILATION_CACHE": "0"})
  assert off.returncode == 0 and "cache_dir=None" in off.stdout, off.stdout[-500:]


def test_every_engines_result_plots_its_runs_with_a_title(tmp_path, in_memory):
  result, _ = in_memory
  path = result.plot(str(tmp_path / "curves.png"), title="two rounds of FedAvg")
  assert path == result.figure and os.path.getsize(path) > 1000
  from matplotlib import image  # pylint: disable=g-import-not-at-top
  assert image.imread(path).shape[0] > 100
