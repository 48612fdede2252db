"""batchfleet entry-script driver (protocol v1).

Loads a user's entry script, calls init() once, then serves `run` requests from the worker
until `shutdown` or end of input. See docs/entry-protocol.md for the protocol.

Usage: python driver.py <code dir> <entry script> [script args...]

File descriptors: the protocol uses private duplicates of the original stdin and stdout.
fd 0 is then pointed at /dev/null and fd 1 at fd 2 (stderr), so nothing the user's code
prints or reads — from Python or from C — can touch the protocol.
"""

import importlib.util
import inspect
import json
import os
import sys
import traceback

PROTOCOL_VERSION = 1


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
    proto_out = open(proto_out_fd, "w", buffering=1, encoding="utf-8")
    return proto_in, proto_out


class Protocol:
    def __init__(self, reader, writer):
        self.reader = reader
        self.writer = writer

    def send(self, msg_type, **fields):
        message = {"v": PROTOCOL_VERSION, "type": msg_type}
        message.update(fields)
        self.writer.write(json.dumps(message, default=str) + "\n")
        self.writer.flush()

    def receive(self):
        """The next request, or None at end of input."""
        line = self.reader.readline()
        if not line:
            return None
        return json.loads(line)


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


def exception_fields(exc):
    return {
        "exception": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }


def load_entry_script(code_dir, entry_script):
    path = os.path.join(code_dir, entry_script)
    name = os.path.splitext(os.path.basename(entry_script))[0] or "entry_script"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError("cannot load entry script %s" % path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def wants_context(run):
    """True when run() takes a second positional parameter (run(mini_batch, context))."""
    try:
        params = inspect.signature(run).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


def is_dataframe(result):
    # Duck-typed so that pandas is only imported by the user's own code.
    return (type(result).__module__.split(".")[0] == "pandas"
            and hasattr(result, "to_csv") and hasattr(result, "columns"))


def write_dataframe(df, output):
    try:
        df.to_csv(output, sep=" ", header=False, index=False, lineterminator="\n")
    except TypeError:  # pandas < 1.5 spells it line_terminator
        df.to_csv(output, sep=" ", header=False, index=False, line_terminator="\n")
    header = df.head(0).to_csv(sep=" ", index=False).strip()
    return len(df), header


def write_rows(result, output):
    """Write run()'s result to `output`; returns (items_out, rows, header)."""
    if is_dataframe(result):
        rows, header = write_dataframe(result, output)
        return rows, rows, header
    if isinstance(result, (list, tuple)):
        with open(output, "w", encoding="utf-8", errors="backslashreplace") as f:
            for element in result:
                f.write(str(element))
                f.write("\n")
        return len(result), len(result), None
    raise BadReturn("run() must return a list, tuple or pandas DataFrame; it returned %s"
                    % ("None" if result is None else type(result).__name__))


def serve_run(protocol, module, pass_context, request):
    batch_id = request.get("batch_id")
    items = list(request.get("items") or [])
    context = MiniBatchContext(request.get("context") or {})
    try:
        if pass_context:
            result = module.run(items, context)
        else:
            result = module.run(items)
    except BaseException as exc:  # SystemExit / KeyboardInterrupt in user code fail the batch
        sys.stderr.write(traceback.format_exc())
        protocol.send("error", batch_id=batch_id, kind="user_error", **exception_fields(exc))
        return
    try:
        items_out, rows, header = write_rows(result, request["output"])
    except BadReturn as exc:
        sys.stderr.write("batchfleet: %s\n" % exc)
        protocol.send("error", batch_id=batch_id, kind="bad_return", exception=None,
                      message=str(exc), traceback=None)
        return
    except Exception as exc:
        sys.stderr.write(traceback.format_exc())
        protocol.send("error", batch_id=batch_id, kind="user_error", **exception_fields(exc))
        return
    protocol.send("done", batch_id=batch_id, items_out=items_out, rows=rows, header=header)


def serve_shutdown(protocol, module):
    error = None
    shutdown = getattr(module, "shutdown", None)
    if callable(shutdown):
        try:
            shutdown()
        except BaseException as exc:
            sys.stderr.write(traceback.format_exc())
            error = exception_fields(exc)
    protocol.send("bye", error=error)


def main(argv):
    proto_in, proto_out = take_protocol_fds()
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

    try:
        module = load_entry_script(code_dir, entry_script)
        if not callable(getattr(module, "run", None)):
            raise AttributeError("entry script %s defines no run(mini_batch) function"
                                 % entry_script)
        init = getattr(module, "init", None)
        if callable(init):
            init()
    except BaseException as exc:
        sys.stderr.write(traceback.format_exc())
        protocol.send("init_error", **exception_fields(exc))
        return 1
    pass_context = wants_context(module.run)
    protocol.send("ready", pid=os.getpid(), pass_context=pass_context,
                  has_shutdown=callable(getattr(module, "shutdown", None)))

    while True:
        try:
            request = protocol.receive()
        except ValueError as exc:
            protocol.send("protocol_error", message="request is not JSON: %s" % exc)
            return 2
        if request is None:
            return 0
        version, msg_type = request.get("v"), request.get("type")
        if version != PROTOCOL_VERSION:
            protocol.send("protocol_error",
                          message="unsupported protocol version %r (this driver speaks %d)"
                          % (version, PROTOCOL_VERSION))
            return 2
        if msg_type == "run":
            serve_run(protocol, module, pass_context, request)
        elif msg_type == "shutdown":
            serve_shutdown(protocol, module)
            return 0
        else:
            protocol.send("protocol_error", message="unknown request type %r" % (msg_type,))
            return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
