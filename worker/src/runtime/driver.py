"""batchfleet entry-script driver (protocol v1).

Loads a user's entry script, calls init() once, then serves `run` requests from the worker
until `shutdown` or end of input. See docs/entry-protocol.md for the protocol.

Usage: python driver.py <code dir> <entry script> [script args...]

Tabular mini-batches (a `run` request with `table`) are read into one pandas DataFrame by
batchfleet_driver_table_v1 (driver_table.py, installed beside this file), which run() gets
instead of a file list; one with no rows is answered `done` with 0 items without calling run().
With BATCHFLEET_TABULAR=1 in the environment pandas is imported before the entry script is
loaded, so a missing pandas is an init error. pyarrow is imported only to read Parquet pieces.
File-list jobs never import either.

Azure's `azureml_user.parallel_run.EntryScript` comes from a folder installed beside the
driver (USER_PACKAGES_DIR), put last on sys.path: a script's own azureml_user comes first.

File descriptors: the protocol uses private duplicates of the original stdin and stdout.
fd 0 is then pointed at /dev/null and fd 1 at fd 2 (stderr), so nothing the user's code
prints or reads — from Python or from C — can touch the protocol. The duplicates are not
inherited by programs the script runs (close-on-exec), and the driver makes itself
non-dumpable so that other processes cannot open them through /proc/<pid>/fd. Code inside the
process can still write to them: the worker checks every answer (see docs/entry-protocol.md).
"""

# Only modules an interpreter has loaded at its start, or that cost nothing to load: a runtime's
# start is the driver's imports plus the script's, and `json` (with `re` and `enum`),
# `importlib.util` (with `contextlib`), `threading` and `signal` each cost a few ms of CPU
# (together about as much as the bare interpreter's start). The protocol's JSON goes through
# CPython's C codec (`_json`) directly, the lifeline thread is a `_thread`; `json`,
# `importlib.util` are the fallbacks where those are not there.
import errno
import os
import select
import sys
import time
import _thread

try:
    from importlib._bootstrap import module_from_spec
    from importlib._bootstrap_external import spec_from_file_location
except ImportError:  # not CPython's import machinery
    from importlib.util import module_from_spec, spec_from_file_location

# Beside this file; the module's folder is on sys.path while the driver is imported (see
# runtime::DRIVER_START), so it is imported here, at the top.
from batchfleet_driver_table_v1 import InputError, import_pandas, read_table, tabular_job

PROTOCOL_VERSION = 1

# The folder beside the driver holding azureml_user (runtime::USER_PACKAGES_DIR).
USER_PACKAGES_DIR = "batchfleet_user_packages_v1"


PR_SET_DUMPABLE = 4


def set_dumpable(value):
    """prctl(PR_SET_DUMPABLE): best effort (no ctypes, or not Linux: nothing happens)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_DUMPABLE, value, 0, 0, 0)
    except Exception:
        pass


def guard_protocol_fds():
    """Keep other processes out of this one's /proc/<pid>/fd (where the protocol pipes could be
    opened anew): a non-dumpable process's /proc files belong to root. A child forked without
    exec is made dumpable again (it holds the fds anyway; exec resets the flag by itself), so
    the worker can still find it by its environment when the runtime ends."""
    set_dumpable(0)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=lambda: set_dumpable(1))


def watch_the_worker(proto_in_fd):
    """End this runtime's whole process group once the worker that started it is gone, even
    killed with SIGKILL: a run() left running would go on with nobody to take its result, beside
    the batch's next attempt elsewhere, holding CPU, memory or a GPU.

    A thread waits, without the GIL, for the request pipe to hang up (no writer left). The worker
    also closes its end on purpose (the runtime then ends at the end of its input, as before):
    only a worker that died leaves this process to another parent, so the group is killed only
    when the parent changed, looked at for 5 s after the hang-up."""
    parent = os.getppid()

    def watch():
        poller = select.poll()
        poller.register(proto_in_fd, 0)  # a hang-up is reported without being asked for
        while not poller.poll():
            pass
        for _ in range(50):
            if os.getppid() != parent:
                import signal
                # The worker starts each runtime as the leader of a group of its own; a group
                # this process does not lead is not its to end.
                if os.getpgrp() == os.getpid():
                    os.killpg(os.getpgrp(), signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.1)

    # A daemon thread: it never holds the interpreter's exit.
    _thread.start_new_thread(watch, ())


def take_protocol_fds():
    """Move the protocol onto private fds and point fds 0/1 where user code can't harm it."""
    sys.stdout.flush()
    proto_in_fd = os.dup(0)
    proto_out_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False, encoding="utf-8",
                      errors="backslashreplace")
    # Buffered: readline() takes whatever the pipe holds in one read() instead of one syscall
    # per byte. Safe because the protocol is strict request/response and nothing else reads
    # this fd: the buffer never holds bytes another reader needed.
    proto_in = open(proto_in_fd, "rb", buffering=1 << 16)
    return proto_in, proto_out_fd


def write_all(fd, data):
    """os.write until every byte is out (a write may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def message_encoder():
    """A function from a message to its JSON text, as json.dumps(message, default=str) gives it.
    JSONEncoder.encode sets up its C encoder anew on every call, which costs more than a small
    message: the C encoder is made once here (when this Python has it)."""
    try:
        from _json import encode_basestring_ascii, make_encoder
        c_encode = make_encoder(None, str, encode_basestring_ascii, None, ": ", ", ", False,
                                False, True)
    except (ImportError, TypeError):  # no C encoder, or one made another way
        import json
        return json.JSONEncoder(default=str).encode
    return lambda message: "".join(c_encode(message, 0))


class DecoderContext:
    """What json.JSONDecoder() holds for its C scanner: json.loads' defaults."""
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"),
                      "NaN": float("nan")}.__getitem__


def message_decoder():
    """A function from a line's text to the JSON value it starts with, as
    json.JSONDecoder().raw_decode(text)[0] gives it; text that is not JSON raises ValueError.
    (raw_decode: a request is one object on its line; decode() would also match the whitespace
    around it, with a regular expression each side.)"""
    try:
        from _json import make_scanner
        scan_once = make_scanner(DecoderContext)
    except (ImportError, TypeError):  # no C scanner
        import json
        raw_decode = json.JSONDecoder().raw_decode
        return lambda text: raw_decode(text)[0]

    def decode(text):
        try:
            return scan_once(text, 0)[0]
        except StopIteration:
            raise ValueError("a line that is not JSON") from None
    return decode


class Protocol:
    def __init__(self, reader, writer_fd):
        self.reader = reader
        self.writer_fd = writer_fd

    # One encoder and decoder for every message: json.dumps and json.loads build anew per call.
    ENCODE = staticmethod(message_encoder())
    DECODE = staticmethod(message_decoder())

    def send(self, msg_type, attached=None, **fields):
        """Send one message; `attached` (bytes) follows its line on the channel, as the
        message's `rows_attached` says."""
        message = {"v": PROTOCOL_VERSION, "type": msg_type}
        message.update(fields)
        # One write per message, straight to the fd: no text layer, no flush.
        data = self.ENCODE(message).encode("utf-8") + b"\n"
        write_all(self.writer_fd, data + attached if attached else data)

    def receive(self):
        """The next request, or None at end of input. A line that is not UTF-8 JSON raises
        ValueError (UnicodeDecodeError is one)."""
        line = self.reader.readline()
        if not line:
            return None
        return self.DECODE(line.decode("utf-8"))


class MiniBatchContext:
    """What Azure passes as run()'s second argument."""

    def __init__(self, fields):
        self.minibatch_index = fields.get("minibatch_index")
        self.partition_key_value = fields.get("partition_key_value") or {}
        self.global_row_index_lower_bound = fields.get("global_row_index_lower_bound", 0)

    def __repr__(self):
        return ("MiniBatchContext(minibatch_index=%r, partition_key_value=%r, "
                "global_row_index_lower_bound=%r)" % (self.minibatch_index,
                                                      self.partition_key_value,
                                                      self.global_row_index_lower_bound))


class BadReturn(Exception):
    pass


# OSErrors that say the storage failed, not the script: read-only, full, over quota, I/O error.
STORAGE_ERRNOS = {errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EIO}


# The input folders this runtime sees read-only (ro_mount), each ending in a separator: an
# EROFS there is the script writing to its inputs, not the storage failing.
READ_ONLY_INPUTS = tuple(
    os.path.join(os.path.realpath(folder), "")
    for folder in os.environ.pop("BATCHFLEET_READ_ONLY_INPUTS", "").split(os.pathsep) if folder)
READ_ONLY_HINT = (" (the job's input folder is read-only to run() with mode ro_mount; "
                  "mode download gives run() copies it may change)")


def writes_to_read_only_input(exc):
    """Whether exc is a write refused inside a read-only input folder."""
    if not READ_ONLY_INPUTS or not isinstance(exc, OSError) or exc.errno != errno.EROFS:
        return False
    for name in (exc.filename, exc.filename2):
        if isinstance(name, (str, bytes)):
            real = os.path.join(os.path.realpath(os.fsdecode(name)), "")
            if real.startswith(READ_ONLY_INPUTS):
                return True
    return False


def failure_kind(exc):
    """user_error, or storage_error for an OSError that says the storage failed."""
    if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
        return "user_error" if writes_to_read_only_input(exc) else "storage_error"
    return "user_error"


def format_exc():
    """traceback.format_exc(), traceback imported only when something failed (it costs every
    interpreter start a few milliseconds)."""
    import traceback
    return traceback.format_exc()


def exception_fields(exc):
    import traceback
    return {
        "exception": type(exc).__name__,
        "message": str(exc) + (READ_ONLY_HINT if writes_to_read_only_input(exc) else ""),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }


def load_entry_script(code_dir, entry_script):
    path = os.path.join(code_dir, entry_script)
    if not os.path.isfile(path):
        raise FileNotFoundError("entry script %s does not exist in the code folder %s"
                                % (entry_script, code_dir))
    name = os.path.splitext(os.path.basename(entry_script))[0] or "entry_script"
    spec = spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError("cannot load entry script %s" % path)
    module = module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def wants_context(run):
    """True when run() takes a second positional parameter (run(mini_batch, context))."""
    code = getattr(run, "__code__", None)
    if type(run) is FUNCTION and code is not None and not hasattr(run, "__wrapped__") \
            and not hasattr(run, "__signature__"):
        # A plain function (the usual entry script): its code object says it, without
        # importing inspect (which costs an interpreter start more than the rest of the driver).
        return code.co_argcount >= 2 or bool(code.co_flags & CO_VARARGS)
    import inspect
    try:
        params = inspect.signature(run).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


FUNCTION = type(wants_context)
CO_VARARGS = 0x04


def is_dataframe(result):
    # Duck-typed so that a file-list job never imports pandas (only its own code may).
    return (type(result).__module__.split(".")[0] == "pandas"
            and hasattr(result, "to_csv") and hasattr(result, "columns"))


def dataframe_csv(df, output=None):
    """The rows of `df` as the aggregated output holds them: written to `output`, or returned
    as text when `output` is None."""
    try:
        return df.to_csv(output, sep=" ", header=False, index=False, lineterminator="\n")
    except TypeError:  # pandas < 1.5 spells it line_terminator
        return df.to_csv(output, sep=" ", header=False, index=False, line_terminator="\n")


# Rows joined per write: few syscalls for a small result, bounded memory for a large one. A
# result of at most this many rows is built in memory first, to be attached to the answer when
# it fits (see write_rows).
ROWS_PER_WRITE = 4096


def write_dataframe(df, output, attach_max=None):
    """Returns (rows, header, attached): `attached` holds the rows' bytes when they fit in
    `attach_max` (then nothing is written), else None."""
    header = df.head(0).to_csv(sep=" ", index=False).strip()
    if attach_max is not None and len(df) <= ROWS_PER_WRITE:
        data = dataframe_csv(df).encode("utf-8")
        if len(data) <= attach_max:
            return len(df), header, data
        write_file(output, [data])
    else:
        dataframe_csv(df, output)
    return len(df), header, None


def line_chunks(elements):
    """One line per element (str()), UTF-8 with backslash escapes for what cannot be encoded,
    ROWS_PER_WRITE elements a chunk."""
    for start in range(0, len(elements), ROWS_PER_WRITE):
        chunk = elements[start:start + ROWS_PER_WRITE]
        yield ("\n".join([str(element) for element in chunk]) + "\n").encode(
            "utf-8", "backslashreplace")


def write_file(output, chunks):
    """Write the byte strings `chunks` to `output` (created or truncated); returns (lines,
    bytes) written: the worker need not read the file back to count them.

    os.open/os.write/os.close: three syscalls for a small result, where open() adds a stat,
    a terminal check and seeks (this runs once per mini-batch).
    """
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0),
                 0o666)
    lines = size = 0
    try:
        for data in chunks:
            write_all(fd, data)
            lines += data.count(b"\n")
            size += len(data)
    finally:
        os.close(fd)
    return lines, size


def write_lines(elements, output, attach_max=None):
    """Returns ((lines, bytes), attached): the rows' bytes when they fit in `attach_max` (then
    nothing is written), else None and the rows are in `output`."""
    chunks = line_chunks(elements)
    if attach_max is not None and len(elements) <= ROWS_PER_WRITE:
        data = next(chunks, b"")
        if len(data) <= attach_max:
            return (data.count(b"\n"), len(data)), data
        chunks = [data]
    return write_file(output, chunks), None


def write_rows(result, output, attach_max=None):
    """Store run()'s result: in `output`, or — when the worker allows it (`attach_max`) and
    the rows fit — as bytes for the answer to carry, which spares the worker a file written
    and read back per mini-batch. Returns (items_out, rows, header, written, attached),
    `written` being the (lines, bytes) in the file when they are known without reading it."""
    if isinstance(result, (list, tuple)):
        written, attached = write_lines(result, output, attach_max)
        return len(result), len(result), None, written, attached
    if is_dataframe(result):
        rows, header, attached = write_dataframe(result, output, attach_max)
        return rows, rows, header, None, attached
    raise BadReturn("run() must return a list, tuple or pandas DataFrame; it returned %s"
                    % ("None" if result is None else type(result).__name__))


def load_table(protocol, batch_id, table, answer):
    """The DataFrame of a tabular mini-batch, or None after sending its input_error."""
    try:
        return read_table(table)
    except InputError as exc:
        sys.stderr.write("batchfleet: %s\n" % exc)
        if exc.traceback:
            sys.stderr.write(exc.traceback)
        protocol.send("error", batch_id=batch_id, kind="input_error", exception=exc.exception,
                      message=str(exc), traceback=exc.traceback, **answer)
    except Exception as exc:  # not plainly about the data: keep the whole story
        sys.stderr.write(format_exc())
        fields = exception_fields(exc)
        fields["message"] = "reading the mini-batch failed: %s" % fields["message"]
        protocol.send("error", batch_id=batch_id, kind="input_error", **fields, **answer)
    return None


def serve_run(protocol, module, pass_context, request):
    # Every answer echoes the request's nonce: the worker takes no other for this batch.
    answer = {"nonce": request["nonce"]} if "nonce" in request else {}
    batch_id = request.get("batch_id")
    table = request.get("table")
    # items_in only travels for tabular batches: a file list's answers stay as they were.
    extra = dict(answer)
    if table is not None:
        mini_batch = load_table(protocol, batch_id, table, answer)
        if mini_batch is None:
            return
        extra["items_in"] = len(mini_batch)
    else:
        mini_batch = list(request.get("items") or [])
    if table is not None and not len(mini_batch):
        # No rows (a byte range holding no row start, an empty file or row group): run() is
        # not called; the batch succeeds with 0 items (its status shows items_in 0).
        result = []
    else:
        try:
            if pass_context:
                result = module.run(mini_batch, MiniBatchContext(request.get("context") or {}))
            else:
                result = module.run(mini_batch)
        except BaseException as exc:  # SystemExit / KeyboardInterrupt in user code fail it
            sys.stderr.write(format_exc())
            protocol.send("error", batch_id=batch_id, kind=failure_kind(exc),
                          **exception_fields(exc), **extra)
            return
    try:
        items_out, rows, header, written, attached = write_rows(
            result, request["output"], request.get("attach_max"))
    except BadReturn as exc:
        sys.stderr.write("batchfleet: %s\n" % exc)
        protocol.send("error", batch_id=batch_id, kind="bad_return", exception=None,
                      message=str(exc), traceback=None, **extra)
        return
    except Exception as exc:
        sys.stderr.write(format_exc())
        protocol.send("error", batch_id=batch_id, kind=failure_kind(exc),
                      **exception_fields(exc), **extra)
        return
    if attached is not None:
        extra["rows_attached"] = len(attached)
    elif written is not None:
        extra["lines"], extra["bytes"] = written
    protocol.send("done", attached=attached, batch_id=batch_id, items_out=items_out,
                  rows=rows, header=header, **extra)


def serve_shutdown(protocol, module):
    error = None
    shutdown = getattr(module, "shutdown", None)
    if callable(shutdown):
        try:
            shutdown()
        except BaseException as exc:
            sys.stderr.write(format_exc())
            error = exception_fields(exc)
    protocol.send("bye", error=error)


def stale(request):
    """Whether a run request sent ahead (behind a running one) was taken up past its
    `start_by` (time.monotonic() seconds)."""
    start_by = request.get("start_by")
    return isinstance(start_by, (int, float)) and time.monotonic() > start_by


def main(argv):
    proto_in, proto_out = take_protocol_fds()
    guard_protocol_fds()
    watch_the_worker(proto_in.fileno())
    protocol = Protocol(proto_in, proto_out)
    if len(argv) < 3:
        protocol.send("init_error", exception="UsageError",
                      message="usage: driver.py <code dir> <entry script> [args...]",
                      traceback=None)
        return 2
    code_dir, entry_script, script_args = argv[1], argv[2], argv[3:]
    sys.argv = [entry_script] + script_args
    # The driver's own folder must not shadow the user's modules.
    sys.path[0] = code_dir
    # azureml_user.parallel_run (EntryScript), last: a script's own azureml_user comes first.
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                 USER_PACKAGES_DIR))

    if tabular_job():
        # Before the entry script, so a missing pandas reads as what it is, not as an
        # ImportError deep inside the user's imports or a failure of every batch. Stage "load":
        # every runtime of this Python fails the same way, so the job fails within seconds
        # instead of retrying until first_task_creation_timeout.
        try:
            import_pandas()
        except InputError as exc:  # pandas missing, or there and failing to import
            sys.stderr.write("batchfleet: %s\n" % exc)
            if exc.traceback:
                sys.stderr.write(exc.traceback)
            protocol.send("init_error", stage="load", exception=exc.exception,
                          message=str(exc), traceback=exc.traceback)
            return 1
        except BaseException as exc:  # an exit while pandas was imported
            sys.stderr.write(format_exc())
            protocol.send("init_error", stage="load", **exception_fields(exc))
            return 1

    # Loading (stage "load": init() never ran, the same code fails the same way every time)
    # and init() (stage "init": may be passing) are told apart for the worker.
    try:
        module = load_entry_script(code_dir, entry_script)
        if not callable(getattr(module, "run", None)):
            raise AttributeError("entry script %s defines no run(mini_batch) function"
                                 % entry_script)
    except BaseException as exc:  # SystemExit at module level (argparse) included
        sys.stderr.write("loading the entry script failed:\n" + format_exc())
        protocol.send("init_error", stage="load", **exception_fields(exc))
        return 1
    try:
        init = getattr(module, "init", None)
        if callable(init):
            init()
    except BaseException as exc:
        sys.stderr.write("init() failed:\n" + format_exc())
        protocol.send("init_error", stage="init", **exception_fields(exc))
        return 1
    pass_context = wants_context(module.run)
    protocol.send("ready", pid=os.getpid(), pass_context=pass_context,
                  has_shutdown=callable(getattr(module, "shutdown", None)))

    while True:
        try:
            request = protocol.receive()
        except ValueError:
            request = {}
        if request is None:
            return 0
        msg_type = request.get("type") if isinstance(request, dict) else None
        if msg_type not in ("run", "shutdown"):
            # Not the worker's: something in the job (the script or a program it ran) wrote to
            # the channel. Skipped, so that it cannot stop the runtime.
            sys.stderr.write("batchfleet: ignored a line on the protocol channel that is not a "
                             "request from the worker\n")
            continue
        version = request.get("v")
        if version != PROTOCOL_VERSION:
            protocol.send("protocol_error",
                          message="unsupported protocol version %r (this driver speaks %d)"
                          % (version, PROTOCOL_VERSION))
            return 2
        if msg_type == "run" and stale(request):
            # Sent ahead and taken up too late: the worker gave its batch back meanwhile.
            answer = {"nonce": request["nonce"]} if "nonce" in request else {}
            protocol.send("skipped", batch_id=request.get("batch_id"), **answer)
        elif msg_type == "run":
            serve_run(protocol, module, pass_context, request)
        else:
            serve_shutdown(protocol, module)
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
