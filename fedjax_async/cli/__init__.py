"""The command-line layer, the only part of the library that imports absl: the run flags
made from ``RunConfig``'s defaults and flags -> config (``run_flags``), the commands that
run them, the sweep's and the data command's flags (``commands``). The library takes
dataclasses.

  cli.define_run_flags()
  app.run(lambda argv: cli.main_from_flags(flags.FLAGS), flags_parser=cli.parse_flags)
"""

from fedjax_async.cli import errors  # error: / internal error: lines, --traceback
from fedjax_async.cli import help  # --help and --helpfull  # pylint: disable=redefined-builtin
from fedjax_async.cli.commands import (SWEEP_UNSUPPORTED_FLAGS, check_sweep_flags,
                                       data_main,
                                       define_data_flags, define_sweep_flags, given_flags,
                                       join_processes, main_from_flags, quiet_library_logs,
                                       reported, sweep_main_from_flags, sweeps_from_flags)
from fedjax_async.cli.run_flags import (HINTS, as_flags, check_flag, check_names, config_from_flags,
                                        define_config_flags, define_run_flags, did_you_mean,
                                        flat_from_flags, import_modules, own_hparams,
                                        parse_flags, unknown_flag_message)

__all__ = ["HINTS", "errors", "help", "as_flags", "check_flag", "check_names", "config_from_flags",
           "define_config_flags", "define_run_flags", "did_you_mean", "flat_from_flags",
           "import_modules", "own_hparams",
           "parse_flags", "unknown_flag_message", "SWEEP_UNSUPPORTED_FLAGS", "check_sweep_flags",
           "data_main", "define_data_flags", "define_sweep_flags", "given_flags",
           "join_processes", "main_from_flags", "quiet_library_logs", "reported",
           "sweep_main_from_flags", "sweeps_from_flags"]
