"""The device suite (``benchmarks/run_all.py --device_suite``): its plan, its flags, its
time budget, and its CPU dry run (``--quick``: the same steps at toy sizes) on what the
accelerator image has: no openfhe, dp-accounting, tensorboardX or tensorflow-datasets.
"""

import json
import os
import subprocess
import sys
import time

import pytest

from benchmarks import common
from benchmarks import run_all

pytestmark = pytest.mark.device_suite  # -m device_suite

FMNIST_DIR = "/usr/share/datasets/fashion-mnist"
IMAGE_LACKS = ("openfhe", "dp_accounting", "tensorboardX", "tensorflow_datasets")
H100 = run_all.Platform("gpu", 1, "NVIDIA H100 80GB HBM3", 16)
CPU = run_all.Platform("cpu", 1, "cpu", 2)


def _flag(step, name):
  values = [a.split("=", 1)[1] for a in step.args if a.startswith(f"--{name}=")]
  return values[-1] if values else None


def test_device_plan_runs_the_accelerator_sizes_and_table_v_on_any_platform():
  for p in (H100, CPU):  # the accelerator's sizes whatever the platform
    steps = run_all.device_plan(p, False, "/r")
    assert [s.name for s in steps] == ["peaks", "fraction_of_peak", "throughput",
                                       "throughput", "scaling", "scaling", "peers",
                                       "paper_shapes", "table_v"]
    assert steps[0].args == []  # peaks: the sizes that fill an accelerator (8192, 16384)
    fop = steps[1]
    assert (_flag(fop, "model"), _flag(fop, "clients"), _flag(fop, "client_chunk")) == (
        "cnn", "10,50,200,1000", "0")  # one vmap of all K
    assert _flag(steps[2], "clients") == "10,50,200,1000"
    # fedjax's per-step dispatch only where it ends within the lease (31 s for 20 logreg
    # rounds at K = 200 on an H200)
    assert _flag(steps[2], "fedjax_loop_max_clients") == "50"
    assert _flag(steps[3], "clients") == "10000" and _flag(steps[3], "loop") == "false"
    for s in steps[4:6]:  # the largest K per round that fits in the device's memory
      assert _flag(s, "sweep") == "k_fit,n" and _flag(s, "budget_gib") == "0"
    assert _flag(steps[5], "models") == "cnn" and _flag(steps[5], "k_cnn").endswith("1000")
    assert _flag(steps[6], "peers_python") == sys.executable  # pfl / Flower where installed
    # Table V's shapes (the paper's CNN, B = 50, 120 steps), 20 runs vmapped, vjp against
    # im2col by slices
    assert (_flag(steps[7], "runs"), _flag(steps[7], "impls")) == ("20", "vjp,slices")
  table_v = run_all.device_plan(H100, False, "/r", data_dir="/d")[-1]
  argv = table_v.argv("t", python="py")
  assert argv[1] == os.path.join(common.ROOT, "benchmarks", "table_v.py")
  assert "--tag=t" in argv
  # the paper's configuration (the default flag files, every run), this lease's rows apart
  assert table_v.args == ["--new_rows=/r/table_v/rows.jsonl", "--data_dir=/d"]
  eight = run_all.device_plan(run_all.Platform("gpu", 8, "H100", 16), False, "/r")
  assert _flag(eight[-3], "devices") == "1,2,4,8" and eight[-3].name == "multidevice"


def test_the_device_suite_runs_peaks_paper_shapes_and_table_v_by_default():
  steps = run_all.device_plan(H100, False, "/r")
  names = lambda chosen: [s.name for s in chosen]
  assert names(run_all.select(steps, [], [], True)) == ["peaks", "paper_shapes", "table_v"]
  assert names(run_all.select(steps, ["throughput", "table_v"], [], True)) == [
      "throughput", "throughput", "table_v"]
  assert names(run_all.select(steps, [], ["table_v"], True)) == ["peaks", "paper_shapes"]
  assert names(run_all.select(steps, ["fraction_of_peak"], [], True)) == ["fraction_of_peak"]
  cpu = run_all.plan(CPU, False, "py")
  assert names(run_all.select(cpu, [], [], False)) == names(cpu)  # the CPU suite: all


def test_the_dry_run_is_the_device_plan_at_toy_sizes():
  full, tiny = (run_all.device_plan(H100, quick, "/r") for quick in (False, True))
  # the second throughput and scaling parts would only repeat the first ones at toy sizes
  full = [full[i] for i in (0, 1, 2, 4, 6, 7, 8)]
  assert [(s.name, s.script) for s in tiny] == [(s.name, s.script) for s in full]
  sizes = {"model", "models", "clients", "examples", "rounds", "reps", "k_logreg", "k_cnn",
           "n_logreg", "k_fixed_logreg", "engine_rounds", "config", "local_epochs",
           "num_clients", "test_subset", "eval_every", "rounds_per_call", "checkpoint_every",
           "fedjax_loop_max_clients", "sizes", "min_time", "runs", "batch", "epochs",
           "precisions", "flagfiles", "num_seeds", "algorithm", "partitions", "deltas",
           "impls", "bandwidth_mib"}
  for f, t in zip(full, tiny):
    other = lambda step: sorted(a for a in step.args if a[2:].split("=")[0] not in sizes)
    assert other(f) == other(t), f.name


def test_every_step_of_the_device_suite_passes_its_flag_checks(tmp_path):
  # at the accelerator's sizes (the dry run below checks its own before it runs)
  env = dict(common.child_env(), FEDJAX_ASYNC_BENCH_RESULTS=str(tmp_path))
  assert run_all.check_flags(run_all.device_plan(H100, False, str(tmp_path)), "t", env) == []


def _run_all(*argv, env=None, timeout=300):
  return subprocess.run([sys.executable, os.path.join(common.ROOT, "benchmarks", "run_all.py"),
                         *argv], env=env or common.child_env(JAX_PLATFORMS="cpu"),
                        capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("argv,message", [
    (["--device_suite", "--time_budget_min=0"], "--time_budget_min: expected a number of "
     "minutes > 0"),
    (["--device_suite", "--time_budget_min=-2"], "--time_budget_min: expected"),
    (["--device_suite", "--time_budget_min=inf"], "--time_budget_min: expected"),
    (["--device_suite", "--data_dir=/nonexistent"], "--data_dir: not a folder"),
    (["--only=table_v"], "--only: peaks, paper_shapes and table_v are steps of "
     "--device_suite"),
])
def test_device_suite_flags_are_refused_in_one_line_naming_the_flag(argv, message):
  proc = _run_all(*argv, "--only_check_args")
  assert proc.returncode == 1, proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("error: --") and message in last, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr


def test_a_step_still_running_at_the_deadline_is_stopped_with_what_it_started(tmp_path):
  script = tmp_path / "slow.py"
  pid_file = tmp_path / "child.pid"
  script.write_text(
      "import subprocess, sys, time\n"
      "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
      f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
      "print('started', flush=True)\n"
      "time.sleep(60)\n")
  step = run_all.Step("throughput", str(script), [], tagged=False)
  t0 = time.monotonic()
  rc = run_all.run_step(step, "t", dict(os.environ), str(tmp_path / "log"),
                        deadline=time.monotonic() + 2.0)
  assert rc == run_all.TIMED_OUT and time.monotonic() - t0 < 30
  log = (tmp_path / "log").read_text()
  assert "started" in log and "stopped at the end of the time budget" in log
  child = int(pid_file.read_text())
  for _ in range(50):  # the grandchild was in the step's process group: ended too
    try:
      os.kill(child, 0)
    except ProcessLookupError:
      break
    time.sleep(0.1)
  else:
    pytest.fail(f"the step's child {child} is still running")
  assert "| throughput | stopped: time budget spent" in run_all.summary(
      [("throughput", rc, 2.0, str(tmp_path / "log"))])
  # a step that ends in time: its own exit status
  ok = tmp_path / "ok.py"
  ok.write_text("print('done')\n")
  assert run_all.run_step(run_all.Step("peers", str(ok), [], tagged=False), "t",
                          dict(os.environ), str(tmp_path / "log2"),
                          deadline=time.monotonic() + 60) == 0


def test_steps_whose_turn_comes_after_the_deadline_are_listed_as_not_run(tmp_path):
  ok = tmp_path / "ok.py"
  ok.write_text("print('done')\n")
  steps = [run_all.Step("throughput", str(ok), [], tagged=False),
           run_all.Step("throughput", str(ok), [], tagged=False),
           run_all.Step("table_v", str(ok), [], tagged=False)]
  done = run_all.run_steps(steps, "t", dict(os.environ), str(tmp_path),
                           deadline=time.monotonic() - 1)
  assert [(part, rc, secs) for part, rc, secs, _ in done] == [
      ("throughput", run_all.NOT_RUN, 0.0), ("throughput_2", run_all.NOT_RUN, 0.0),
      ("table_v", run_all.NOT_RUN, 0.0)]
  assert not list(tmp_path.glob("*.log"))  # none started
  assert "| table_v | not run: time budget spent | 0 |" in run_all.summary(done)
  done = run_all.run_steps(steps[:1], "t", dict(os.environ), str(tmp_path),
                           deadline=time.monotonic() + 60)
  assert done[0][:2] == ("throughput", 0)
  assert "done" in (tmp_path / "throughput.log").read_text()


def _image_like_env(tmp_path):
  """The environment of the accelerator image: the packages it lacks cannot be imported
  (a sitecustomize on PYTHONPATH, which the suite passes on to its steps)."""
  site = tmp_path / "image_site"
  site.mkdir()
  (site / "sitecustomize.py").write_text(
      "import sys\n"
      f"LACKS = {IMAGE_LACKS!r}\n"
      "class _Lacks:\n"
      "  def find_spec(self, name, path=None, target=None):\n"
      "    if name.split('.')[0] in LACKS:\n"
      "      raise ModuleNotFoundError(f'No module named {name!r} (not on the image)')\n"
      "sys.meta_path.insert(0, _Lacks())\n")
  env = common.child_env(JAX_PLATFORMS="cpu")
  env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
  return env


@pytest.mark.skipif(not os.path.isfile(os.path.join(FMNIST_DIR, "t10k-labels-idx1-ubyte.gz")),
                    reason=f"Fashion-MNIST IDX files not in {FMNIST_DIR} (apt-get install "
                    "dataset-fashion-mnist): Table V needs them")
@pytest.mark.slow  # 155-220 s on 2 cores (seven steps, each a JAX process)
def test_device_suite_dry_run_writes_every_steps_rows_and_table_v_beside_the_paper(
    tmp_path):
  env = _image_like_env(tmp_path)
  check = subprocess.run([sys.executable, "-c", "import dp_accounting"], env=env,
                         capture_output=True, text=True)
  assert "not on the image" in check.stderr  # the emulation holds in the steps' Python
  results = tmp_path / "out"
  every = "peaks,fraction_of_peak,throughput,scaling,peers,paper_shapes,table_v"
  proc = _run_all("--device_suite", "--quick", f"--results_dir={results}", "--tag=dry",
                  f"--data_dir={FMNIST_DIR}", f"--only={every}", env=env, timeout=600)
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
  for part in every.split(","):
    assert f"| {part} | ok |" in proc.stdout
    assert (results / "logs" / "dry" / f"{part}.log").exists()
  for bench in ("peaks", "fraction_of_peak", "throughput", "peers", "scaling", "paper_shapes"):
    rows = [json.loads(l) for l in open(results / f"{bench}.jsonl")]
    assert rows and {r["tag"] for r in rows} == {"dry"}
  # --allocator=auto: tcmalloc preloaded where it is installed, and every row says which
  expected = "tcmalloc" if common.find_tcmalloc() else "system"
  assert {json.loads(l)["allocator"] for bench in ("fraction_of_peak", "throughput")
          for l in open(results / f"{bench}.jsonl")} == {expected}
  tp = [json.loads(l) for l in open(results / "throughput.jsonl")]
  assert {r["clients_per_round"] for r in tp} == {2}
  scaling = [json.loads(l) for l in open(results / "scaling.jsonl")]
  assert [r["sweep"] for r in scaling if r["sweep"] == "k_fit"] == ["k_fit"]
  # one vmap of K streams nothing: the kept-uploads pass would repeat the same rounds
  assert not any(r["sweep"] == "k_kept" for r in scaling)
  peaks = [json.loads(l) for l in open(results / "peaks.jsonl")]
  assert [r["precision"] for r in peaks] == ["float32", "tf32", "bf16", "default"]
  shapes = [json.loads(l) for l in open(results / "paper_shapes.jsonl")]
  assert [(r["precision"], r["peak_precision"]) for r in shapes] == [
      ("float32", "default"), ("bf16", "bf16")]
  bw = [json.loads(l) for l in open(results / "bandwidth.jsonl")]
  assert len(bw) == 1 and bw[0]["gbytes_per_s"] > 0
  for r in shapes:  # the roofline: max(FLOPs / peak, bytes / bandwidth) per step
    flops = r["step_mflop_analytic"] * 1e6 * r["runs"] * r["clients_per_round"]
    bound_s = max(flops / (r["peak_gflops"] * 1e9),
                  r["step_bytes_xla"] / (r["bandwidth_gbs"] * 1e9))
    assert r["roofline_gflops"] == pytest.approx(flops / bound_s / 1e9, rel=1e-6)
    assert r["fraction_of_roofline"] == pytest.approx(
        r["gflops_analytic"] / r["roofline_gflops"], rel=1e-6)
  profiles = (results / "paper_shapes_profile.md").read_text()
  assert profiles.count("### Profile: ") == 2 and "| op | ms | share | events |" in profiles
  from benchmarks import profile_summary  # pylint: disable=g-import-not-at-top
  stored = [json.loads(l) for l in open(results / "paper_shapes_profile.jsonl")]
  assert profile_summary.format_file(stored) == profiles  # the table of its stored rows
  table = [json.loads(l) for l in open(results / "table_v" / "rows.jsonl")]
  assert sorted((r["algorithm"], r["delta"]) for r in table) == [
      ("fedavg", 0.0), ("fedavg", 0.7), ("pafed", 0.0), ("pafed", 0.7)]
  report = (results / "logs" / "dry" / "report.md").read_text()
  assert report.startswith("# Device suite, tag dry: 1 x ")
  for title in ("fraction of the matmul peak", "Engine vs per-client loops", "roofline",
                "Time and peak memory", "largest N", "largest K per round",
                "four systems in one run", "## Table V (PAFed paper, Fashion-MNIST)"):
    assert title in report
  for png in ("fraction_of_peak.png", "throughput.png", "scaling_n.png", "scaling_k.png"):
    assert (results / "logs" / "dry" / png).read_bytes()[:4] == b"\x89PNG"
  assert "| non-IID δ=0 |" in report and "| non-IID δ=0.7 |" in report
  assert "| 0.835 |" in report and "| 0.840 |" in report  # FedAvg's δ = 0, PAFed's δ = 0.7


def test_fedjax_pattern_is_timed_only_up_to_its_client_cap(tmp_path):
  env = dict(common.child_env(JAX_PLATFORMS="cpu"), FEDJAX_ASYNC_BENCH_RESULTS=str(tmp_path))
  proc = subprocess.run(
      [sys.executable, os.path.join(common.ROOT, "benchmarks", "throughput.py"),
       "--models=logreg", "--clients=2,3", "--rounds=1", "--reps=1", "--examples=10",
       "--noloop", "--fedjax_loop_max_clients=2"],
      env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = {r["clients_per_round"]: r for r in map(json.loads, open(tmp_path / "throughput.jsonl"))}
  assert rows[2]["fedjax_loop_s"] > 0 and rows[3]["fedjax_loop_s"] != rows[3]["fedjax_loop_s"]


def test_the_datasheet_peaks_are_the_dense_figures_of_the_detected_device():
  from benchmarks import peaks
  # NVIDIA's datasheets print the Hopper tensor figures with sparsity: dense is half
  assert peaks.datasheet_model("NVIDIA H100 80GB HBM3") == "H100 SXM"
  assert peaks.datasheet_tflops("NVIDIA H100 80GB HBM3", "tf32") == 989 / 2 == 494.5
  assert peaks.datasheet_tflops("NVIDIA H100 80GB HBM3", "bf16") == 1979 / 2
  assert peaks.datasheet_tflops("NVIDIA H100 80GB HBM3", "float32") == 67
  assert peaks.datasheet_tflops("NVIDIA H200", "default") == 494.5  # float32 dots: TF32
  assert peaks.datasheet_model("NVIDIA H100 PCIe") == "H100 PCIe"
  assert peaks.datasheet_tflops("NVIDIA H100 PCIe", "bf16") == 1513 / 2
  assert peaks.datasheet_model("NVIDIA H100 NVL") == "H100 NVL"
  assert peaks.datasheet_tflops("NVIDIA A100-SXM4-40GB", "tf32") == 156
  assert peaks.datasheet_tflops("NVIDIA A100 80GB PCIe", "bf16") == 312
  for unknown in ("cpu", "TPU v5 lite", "NVIDIA GeForce RTX 4090", "NVIDIA H100"):
    assert peaks.datasheet_model(unknown) is None
    assert peaks.datasheet_text(unknown, "bf16") == "datasheet: unknown"


def test_each_peak_runs_its_product_in_its_precision_and_workloads_use_theirs():
  from benchmarks import peaks
  expected = {"float32": ("HIGHEST", "f32"), "tf32": ("HIGH", "f32"),
              "bf16": ("DEFAULT", "bf16"), "default": ("DEFAULT", "f32")}
  for precision, (prec, dtype) in expected.items():
    dots = [l for l in peaks.lower(precision, 16)[0].as_text().splitlines()
            if "dot_general" in l]
    assert len(dots) == 1 and f"precision = [{prec}, {prec}]" in dots[0], dots
    assert f"tensor<16x16x{dtype}>, tensor<16x16x{dtype}>" in dots[0], dots
  # float32 local training runs at the process's default matmul precision
  assert [peaks.workload_peak_precision(p) for p in ("float32", "tf32", "bf16")] == [
      "default", "tf32", "bf16"]


def test_peaks_and_paper_shapes_write_their_rows_at_toy_sizes(tmp_path):
  env = dict(common.child_env(JAX_PLATFORMS="cpu"), FEDJAX_ASYNC_BENCH_RESULTS=str(tmp_path))
  bench = lambda name, *args: subprocess.run(
      [sys.executable, os.path.join(common.ROOT, "benchmarks", name), *args], env=env,
      capture_output=True, text=True, timeout=300)
  proc = bench("peaks.py", "--sizes=32,64", "--min_time=0.001", "--reps=1")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.count("datasheet: unknown") == 4
  rows = [json.loads(l) for l in open(tmp_path / "peaks.jsonl")]
  assert [r["precision"] for r in rows] == ["float32", "tf32", "bf16", "default"]
  assert all(r["peak_gflops"] > 0 and r["n"] in (32, 64) and r["datasheet_tflops"] is None
             for r in rows)
  proc = bench("paper_shapes.py", "--model=logreg", "--runs=2", "--clients=2",
               "--num_clients=4", "--examples=20", "--batch=10", "--epochs=1", "--reps=1",
               "--precisions=bf16")
  assert proc.returncode == 0, proc.stderr[-3000:]
  (row,) = [json.loads(l) for l in open(tmp_path / "paper_shapes.jsonl")]
  assert (row["precision"], row["peak_precision"], row["runs"], row["local_steps"]) == (
      "bf16", "bf16", 2, 2)
  # 2 runs x 2 clients x 2 steps of 10 examples in the one timed round
  assert abs(row["examples_per_s"] * row["seconds"] - 80) < 1e-6
  flops = 2 * 2 * 2 * row["step_mflop_analytic"] * 1e6
  assert abs(row["gflops_analytic"] * 1e9 * row["seconds"] / flops - 1) < 1e-9
  assert abs(row["fraction_of_peak_analytic"] - row["gflops_analytic"] / row["peak_gflops"]) < 1e-12
  assert abs(row["projected_run_s"] - row["seconds"] / 2 * 100) < 1e-9


_XSPACE = """
planes {
  id: 1 name: "/device:GPU:0"
  lines { id: 1 name: "XLA Ops"
    events { metadata_id: 1 offset_ps: 0 duration_ps: 3000000
             stats { metadata_id: 7 str_value: "convolution" } }
    events { metadata_id: 2 offset_ps: 4000000 duration_ps: 1000000
             stats { metadata_id: 7 str_value: "fusion" } }
    events { metadata_id: 1 offset_ps: 6000000 duration_ps: 2000000
             stats { metadata_id: 7 str_value: "convolution" } } }
  lines { id: 2 name: "XLA Modules"
    events { metadata_id: 3 offset_ps: 0 duration_ps: 9000000 } }
  event_metadata { key: 1 value { id: 1 name: "conv.1" } }
  event_metadata { key: 2 value { id: 2 name: "fusion.2" } }
  event_metadata { key: 3 value { id: 3 name: "jit_step" } }
  stat_metadata { key: 7 value { id: 7 name: "hlo_category" } }
}
planes { id: 2 name: "/host:CPU" }
"""


def test_a_gpu_trace_is_summed_by_op_and_category_from_its_op_line_only():
  from benchmarks import profile_summary
  if not profile_summary.available():
    pytest.skip("this jax's jax.profiler.ProfileData is None (jax 0.6); leg 2 runs it")
  import jax  # pylint: disable=g-import-not-at-top
  pd = jax.profiler.ProfileData
  s = profile_summary.summarize_data(
      pd.from_serialized_xspace(pd.text_proto_to_serialized_xspace(_XSPACE)))
  # by hand: conv.1 3 + 2 us, fusion.2 1 us; the module line (9 us) is not an op
  assert s["source"] == "/device:GPU:0" and s["events"] == 3 and s["busy_ns"] == 6000
  assert s["by_name"] == [("conv.1", 5000.0, 2), ("fusion.2", 1000.0, 1)]
  assert s["by_category"] == [("convolution", 5000.0, 2), ("fusion", 1000.0, 1)]
  text = profile_summary.format_summary(s, top=1, title="t")
  assert "| conv.1 | 0.01 | 83.3% | 2 |" in text and "fusion.2" not in text
