"""azureml_user.parallel_run as batchfleet provides it (see docs/entry-protocol.md, EntryScript).

Azure ML's parallel runtime gives entry scripts an `EntryScript` helper: a logger whose lines
go to the job's user logs, the folders the script may write to, and which node and process it
runs in. batchfleet's driver puts this package on the module search path after the script's
own folder and every user path, so a script that ships its own `azureml_user` keeps its own.

What it reads, set by the worker for each runtime:
  BATCHFLEET_LOGGING_LEVEL  the job's logging_level (DEBUG, INFO, WARNING)
  BATCHFLEET_NODE_ID        the worker's id
  BATCHFLEET_PROCESS_NAME   the runtime's name, as its user log is named (slot-<n>-<seq>)
  BATCHFLEET_LOG_DIR        a folder whose files are uploaded beside the user log
  BATCHFLEET_WORKING_DIR    the runtime's own working folder
  AZUREML_BI_OUTPUT_PATH    the job's output folder, as for Azure
"""

import logging
import os
import sys

LOG_FORMAT = "%(asctime)s|%(name)s|%(funcName)s()|%(levelname)s|%(message)s"
LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING,
          "ERROR": logging.ERROR, "CRITICAL": logging.CRITICAL}


def _env(name, default):
    return os.environ.get(name) or default


class _Singleton(type):
    """EntryScript() is the same object wherever it is called, as in Azure."""

    _instance = None

    def __call__(cls, *args, **kwargs):
        if cls._instance is None:
            cls._instance = super(_Singleton, cls).__call__(*args, **kwargs)
        return cls._instance


class EntryScript(metaclass=_Singleton):
    """The helper Azure's parallel runtime gives entry scripts (`azureml_user.parallel_run`)."""

    def __init__(self, logging_level=None):
        self._logger = None
        level = logging_level or _env("BATCHFLEET_LOGGING_LEVEL", "INFO")
        if isinstance(level, str):
            level = LEVELS.get(level.upper(), logging.INFO)
        self.logging_level = level

    def __reduce__(self):
        return (self.__class__, ())

    def config_log(self):
        """Set up `logger`: its lines go to this runtime's stderr, which is its user log
        (logs/user/<worker>/<process name>.txt under the job root)."""
        logger = logging.getLogger("ParallelRunStep")
        logger.setLevel(self.logging_level)
        # Not to the root logger as well: a script that configures logging itself would log
        # every line twice.
        logger.propagate = False
        if not any(getattr(h, "_batchfleet", False) for h in logger.handlers):
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter(LOG_FORMAT))
            handler._batchfleet = True
            logger.addHandler(handler)
        self._logger = logger

    @property
    def logger(self):
        """A standard logging.Logger at the job's logging_level; its lines land in the job's
        user logs under this worker and slot."""
        if self._logger is None:
            self.config_log()
        return self._logger

    @property
    def log_dir(self):
        """A folder for the script's own log files; they are uploaded to
        logs/user/<worker>/<process name>/ under the job root when the runtime stops."""
        return _env("BATCHFLEET_LOG_DIR", os.path.join(self.working_dir, "logs"))

    @property
    def working_dir(self):
        """This runtime's own working folder (its current folder when it started)."""
        return _env("BATCHFLEET_WORKING_DIR", os.getcwd())

    @property
    def output_dir(self):
        """The job's output folder (AZUREML_BI_OUTPUT_PATH); it exists. Files written there
        are stored in the job's output, as run()'s are."""
        return _env("AZUREML_BI_OUTPUT_PATH", os.path.join(self.working_dir, "output"))

    @property
    def node_id(self):
        """The worker this runtime runs on (Azure: the node)."""
        return _env("BATCHFLEET_NODE_ID", "local")

    @property
    def process_name(self):
        """This runtime's name, unique on its worker: slot-<slot>-<start> (Azure: processNNN)."""
        return _env("BATCHFLEET_PROCESS_NAME", "process%03d" % os.getpid())

    @property
    def agent_name(self):
        """The same as process_name, as in Azure."""
        return self.process_name
