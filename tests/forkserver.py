"""The tests' Python subprocesses as forks of a process that imported JAX once.

Most of the suite's subprocesses are ``python <script> <flags>`` (experiments/run.py, the
benchmarks' flag checks, ...) or ``python -c <code>``, and each spent 1.5-3 s on the 2-core
VM importing JAX, Flax, optax, orbax and matplotlib before doing anything. A fork server
(one per pytest process and JAX environment) imports them once, then forks a child per
command: the child sets the command's environment, working directory, ``sys.argv`` and
``sys.path`` as the interpreter would, points fds 0-2 at /dev/null and the captured files,
runs the script (``runpy``), joins its threads, runs its ``atexit`` functions and exits with
its status. No JAX backend exists before the fork (the server only imports), so each child
initialises its own, reading its own ``XLA_FLAGS``; variables read at start-up or import
(``STARTUP_VARS``: ``JAX_*``, ``PYTHONPATH``, ``LD_PRELOAD``, ...) pick a server started
with the command's own.

``run`` takes ``subprocess.run``'s arguments and returns its ``CompletedProcess``; a call it
cannot serve alike (stdin input, another executable, interpreter options, a child that
must get signals: those use ``Popen``) runs as a real subprocess. ``conftest.py`` routes
``subprocess.run`` here; ``FEDJAX_ASYNC_TEST_FORK=0`` turns it off.
"""

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading

ENV = "FEDJAX_ASYNC_TEST_FORK"
HERE = os.path.dirname(os.path.abspath(__file__))
PRELOAD = ("numpy", "jax", "jax.numpy", "flax.linen", "optax", "absl.app", "absl.flags",
           "absl.logging", "orbax.checkpoint", "matplotlib", "matplotlib.pyplot",
           "fedjax_async.api", "fedjax_async.cli", "fedjax_async.cli.commands")
_REAL_RUN = subprocess.run
_SERVERS = {}  # _server_key -> (Popen, socket)
_LOCK = threading.Lock()


# Variables read when the interpreter starts or a preloaded library loads (JAX's
# configuration, the allocator, BLAS / OpenMP threads, stdio buffering, where the package
# is imported from): a server is started with the command's own.
STARTUP_VARS = ("JAX_", "PYTHON", "LD_", "MALLOC", "OMP_", "OPENBLAS_", "MKL_", "TF_")


def _server_key(env):
  """The variables of ``env`` a server must have been started with (``STARTUP_VARS``)."""
  return tuple(sorted((k, v) for k, v in env.items() if k.startswith(STARTUP_VARS)))


def _servable(args, kwargs) -> bool:
  """Whether a ``subprocess.run`` call is one a forked child runs alike."""
  allowed = {"env", "cwd", "capture_output", "text", "timeout", "check", "stdout",
             "stderr", "universal_newlines", "encoding"}
  if os.environ.get(ENV, "1") == "0" or set(kwargs) - allowed:
    return False
  if kwargs.get("stdout") not in (None, subprocess.PIPE) or (
      kwargs.get("stderr") not in (None, subprocess.PIPE, subprocess.STDOUT)):
    return False
  if not kwargs.get("capture_output") and (kwargs.get("stdout") is None
                                           or kwargs.get("stderr") is None):
    return False  # output to the test's own stdout / stderr: left as it is
  if not isinstance(args, (list, tuple)) or len(args) < 2 or args[0] != sys.executable:
    return False
  first = str(args[1])
  return (first == "-c" and len(args) >= 3) or (not first.startswith("-")
                                                and first.endswith(".py"))


def _server(env):
  key = _server_key(env)
  got = _SERVERS.get(key)
  if got is not None and got[0].poll() is None:
    return got
  parent, child = socket.socketpair()
  server_env = dict(env, PYTHONPATH=os.pathsep.join(
      [HERE] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]))
  proc = subprocess.Popen([sys.executable, os.path.join(HERE, "forkserver.py"),
                           str(child.fileno())], env=server_env, pass_fds=[child.fileno()],
                          stdin=subprocess.DEVNULL)
  child.close()
  _SERVERS[key] = (proc, parent)
  return proc, parent


def _close_all():
  for proc, sock in _SERVERS.values():
    sock.close()
    proc.kill()
    proc.wait()


atexit.register(_close_all)


def _read_line(sock, timeout):
  data = b""
  while not data.endswith(b"\n"):
    ready, _, _ = select.select([sock], [], [], timeout)
    if not ready:
      return None
    chunk = sock.recv(4096)
    if not chunk:
      raise RuntimeError("the fork server exited")
    data += chunk
  return json.loads(data)


def run(args, **kwargs):
  """``subprocess.run(args, **kwargs)``, as a forked child where ``_servable``."""
  if not _servable(args, kwargs):
    return _REAL_RUN(args, **kwargs)
  env = dict(kwargs.get("env") or os.environ)
  text = kwargs.get("text") or kwargs.get("universal_newlines") or bool(kwargs.get("encoding"))
  timeout = kwargs.get("timeout")
  with _LOCK, tempfile.TemporaryDirectory(prefix="forkrun_") as tmp:
    out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
    if kwargs.get("stderr") == subprocess.STDOUT:
      err = out
    proc, sock = _server(env)
    request = {"argv": [str(a) for a in args[1:]], "env": env,
               "cwd": os.path.abspath(kwargs.get("cwd") or os.getcwd()),
               "stdout": out, "stderr": err}
    sock.sendall((json.dumps(request) + "\n").encode())
    pid = _read_line(sock, 120)["pid"]
    reply = _read_line(sock, timeout)
    if reply is None:  # the timeout: kill the child, as subprocess.run does
      os.kill(pid, signal.SIGKILL)
      _read_line(sock, 60)
      raise subprocess.TimeoutExpired(args, timeout)
    def read(path):
      with open(path, "r" if text else "rb",
                **({"encoding": kwargs.get("encoding")} if text else {})) as f:
        return f.read()
    stdout = read(out) if os.path.exists(out) else ("" if text else b"")
    stderr = None if err == out else (read(err) if os.path.exists(err) else "" if text else b"")
  done = subprocess.CompletedProcess(args, reply["rc"], stdout, stderr)
  if kwargs.get("check"):
    done.check_returncode()
  return done


# ------------------------------------------------------------------ the server side


def _child(request):
  """In the forked child: the interpreter's start-up for the request, then the script."""
  import runpy  # pylint: disable=g-import-not-at-top
  import traceback  # pylint: disable=g-import-not-at-top
  null = os.open(os.devnull, os.O_RDONLY)
  os.dup2(null, 0)
  out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
  err = out if request["stderr"] == request["stdout"] else os.open(
      request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
  os.dup2(out, 1)
  os.dup2(err, 2)
  os.environ.clear()
  os.environ.update(request["env"])
  os.chdir(request["cwd"])
  argv = request["argv"]
  extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
  site = [p for p in sys.path[1:] if p not in _SERVER_PATH]
  code = 0
  try:
    if argv[0] == "-c":
      sys.argv = ["-c"] + argv[2:]
      sys.path[:] = [""] + extra + site
      exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})  # pylint: disable=exec-used
    else:
      script = os.path.abspath(argv[0])
      sys.argv = argv
      sys.path[:] = [os.path.dirname(script)] + extra + site
      runpy.run_path(script, run_name="__main__")
  except SystemExit as e:
    if e.code is None:
      code = 0
    elif isinstance(e.code, int):
      code = e.code
    else:
      print(e.code, file=sys.stderr)
      code = 1
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
    code = 1
  try:
    threading._shutdown()  # pylint: disable=protected-access  (as at interpreter exit)
    atexit._run_exitfuncs()  # pylint: disable=protected-access
    sys.stdout.flush()
    sys.stderr.flush()
  finally:
    os._exit(code & 0xFF)  # pylint: disable=protected-access


_SERVER_PATH = set()


def serve(fd: int):
  """The server: imports ``PRELOAD``, then forks a child per request line on ``fd``."""
  import importlib  # pylint: disable=g-import-not-at-top
  _SERVER_PATH.update([HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(
      os.pathsep) if p])
  for name in PRELOAD:
    importlib.import_module(name)
  sock = socket.socket(fileno=fd)
  stream = sock.makefile("rb")
  for line in stream:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
      stream.close()
      sock.close()
      _child(request)
    sock.sendall((json.dumps({"pid": pid}) + "\n").encode())
    _, status = os.waitpid(pid, 0)
    rc = (os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status))
    sock.sendall((json.dumps({"rc": rc}) + "\n").encode())


if __name__ == "__main__":
  serve(int(sys.argv[1]))
