"""batchfleet entry-script driver (protocol v1).

Loads a user's entry script, calls init() once, then serves `run` requests from the worker
until `shutdown` or end of input. See docs/entry-protocol.md for the protocol.

Usage: python driver.py <code dir> <entry script> [script args...]

Tabular mini-batches (a `run` request with `table`) are read into one pandas DataFrame, which
run() gets instead of a file list; one with no rows is answered `done` with 0 items without
calling run(). With BATCHFLEET_TABULAR=1 in the environment pandas is
imported before the entry script is loaded, so a missing pandas is an init error. pyarrow is
imported only to read Parquet pieces. File-list jobs never import either.

Azure's `azureml_user.parallel_run.EntryScript` comes from a folder installed beside the
driver (USER_PACKAGES_DIR), put last on sys.path: a script's own azureml_user comes first.

File descriptors: the protocol uses private duplicates of the original stdin and stdout.
fd 0 is then pointed at /dev/null and fd 1 at fd 2 (stderr), so nothing the user's code
prints or reads — from Python or from C — can touch the protocol. The duplicates are not
inherited by programs the script runs (close-on-exec), and the driver makes itself
non-dumpable so that other processes cannot open them through /proc/<pid>/fd. Code inside the
process can still write to them: the worker checks every answer (see docs/entry-protocol.md).
"""

import importlib.util
import errno
import json
from json.encoder import encode_basestring_ascii
import os
import re
import sys

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


def encode_flat(message):
    """The JSON of a message whose values are all strings, integers or None (a `done`), built
    directly: JSONEncoder.encode sets up its C encoder anew on every call, which costs more than
    the message. None for any other message."""
    parts = []
    for key, value in message.items():
        if value is None:
            text = "null"
        elif type(value) is str:
            text = encode_basestring_ascii(value)
        elif type(value) is int:
            text = int.__repr__(value)
        else:
            return None
        parts.append(encode_basestring_ascii(key) + ": " + text)
    return "{" + ", ".join(parts) + "}"


class Protocol:
    def __init__(self, reader, writer_fd):
        self.reader = reader
        self.writer_fd = writer_fd

    # One encoder for every message: json.dumps(..., default=str) builds a new one per call.
    ENCODER = json.JSONEncoder(default=str)
    DECODER = json.JSONDecoder()

    def send(self, msg_type, attached=None, **fields):
        """Send one message; `attached` (bytes) follows its line on the channel, as the
        message's `rows_attached` says."""
        message = {"v": PROTOCOL_VERSION, "type": msg_type}
        message.update(fields)
        # One write per message, straight to the fd: no text layer, no flush.
        data = (encode_flat(message) or self.ENCODER.encode(message)).encode("utf-8") + b"\n"
        write_all(self.writer_fd, data + attached if attached else data)

    def receive(self):
        """The next request, or None at end of input. A line that is not UTF-8 JSON raises
        ValueError (UnicodeDecodeError is one)."""
        line = self.reader.readline()
        if not line:
            return None
        return self.DECODER.decode(line.decode("utf-8"))


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


class InputError(Exception):
    """A tabular mini-batch's data could not be read into a DataFrame; run() is not called.

    `exception` names the underlying exception type (or None); `traceback` is kept only for
    errors that are not plainly about the data.
    """

    def __init__(self, message, exception=None, traceback=None):
        Exception.__init__(self, message)
        self.exception = exception
        self.traceback = traceback


def tabular_job():
    return os.environ.get("BATCHFLEET_TABULAR") == "1"


def missing_package_message(package, why):
    return ("this job reads %s; the worker's Python (%s) has no %s: pip install %s"
            % (why, sys.executable, package, package))


def import_pandas():
    """pandas, or an InputError that says how to get it."""
    try:
        import pandas
    except ImportError as exc:
        raise InputError(missing_package_message("pandas", "tabular data (an mltable input)"),
                         exception=type(exc).__name__)
    return pandas


def import_parquet():
    try:
        import pyarrow.parquet
    except ImportError as exc:
        raise InputError(missing_package_message("pyarrow", "Parquet data (read_parquet)"),
                         exception=type(exc).__name__)
    return pyarrow.parquet


def read_delimited(pd, table, piece):
    path = piece["path"]
    delimiter = table.get("delimiter") or ","
    header = bool(table.get("header"))
    options = {"encoding": table.get("encoding") or "utf-8",
               "header": 0 if header else None,
               "keep_default_na": False}
    if len(delimiter) == 1:
        options["sep"] = delimiter
        # Infer each column's type from the whole piece, not chunk by chunk (which can leave a
        # column with ints in one part and strings in another, with a DtypeWarning).
        options["low_memory"] = False
    else:  # pandas takes a longer separator for a regular expression
        options["sep"] = re.escape(delimiter)
        options["engine"] = "python"
    if table.get("empty_as_string"):
        options["na_filter"] = False
    else:
        options["na_values"] = [""]
    if not table.get("infer_column_types", True):
        options["dtype"] = object  # every column as text, as mltable reads it without inference
    if os.path.getsize(path) == 0:
        return pd.DataFrame(), False
    try:
        df = pd.read_csv(path, **options)
    except pd.errors.EmptyDataError:  # only blank lines
        return pd.DataFrame(), False
    if not header:
        df.columns = ["Column%d" % (i + 1) for i in range(len(df.columns))]
    return df, True


def read_json_lines(pd, table, piece):
    drop = table.get("invalid_lines") == "drop"
    records = []
    with open(piece["path"], "r", encoding=table.get("encoding") or "utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if isinstance(record, dict):
                records.append(record)
            elif not drop:
                preview = line.strip()
                if len(preview) > 80:
                    preview = preview[:80] + "..."
                raise InputError(
                    "%s: line %d of this mini-batch's piece of the file is not a JSON object: "
                    "%s (read_json_lines' invalid_lines: drop skips such lines)"
                    % (piece.get("url"), number, preview),
                    exception="ValueError")
    if not records:
        return pd.DataFrame(), False
    return pd.DataFrame.from_records(records), True


def read_parquet(pd, table, piece):
    parquet = import_parquet()
    source = parquet.ParquetFile(piece["path"])
    row_groups = piece.get("row_groups")
    if row_groups is None:
        data = source.read()
    else:
        first, last = row_groups
        data = source.read_row_groups(list(range(first, last)))
    df = data.to_pandas()
    if any(name is not None for name in df.index.names):
        df = df.reset_index()  # a named index written by pandas is data
    return df, True


READERS = {"delimited": read_delimited, "json_lines": read_json_lines, "parquet": read_parquet}

# infer_column_types (read_delimited): what mltable types beyond pandas' own ints and floats.
BOOL_TEXT = {"true": True, "false": False}
ISO_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}"
                          r"(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d{1,9})?)?"
                          r"(?:Z|[+-]\d{2}(?::?\d{2})?)?)?")
ISO_OFFSET = re.compile(r"(?:Z|[+-]\d{2}(?::?\d{2})?)$")


def infer_column(pd, column):
    """A text column as bool / datetime64[ns] when every non-missing value is one, else None.

    Booleans: `true` / `false` in any case (surrounding blanks ignored); with missing cells the
    column is pandas' nullable `boolean` (True / False / <NA>). Dates: ISO-8601 dates and
    datetimes (`2024-01-31`, `2024-01-31T08:00:00.5`, with `Z` or an offset converted to UTC
    and made naive); missing cells are NaT. Anything else, or a value that only looks like a
    date (`2024-13-45`), leaves the column as it was."""
    values = column.dropna()
    if not len(values):
        return None
    text = values.astype(str).str.strip()
    first = text.iloc[0]
    if first.lower() in BOOL_TEXT:
        lowered = text.str.lower()
        if not lowered.isin(BOOL_TEXT.keys()).all():
            return None
        if len(values) == len(column):
            return lowered.map(BOOL_TEXT).astype(bool).reindex(column.index)
        typed = pd.Series(pd.NA, index=column.index, dtype="boolean")
        typed[values.index] = lowered.map(BOOL_TEXT).astype(bool)
        return typed
    if ISO_DATETIME.fullmatch(first) and text.str.fullmatch(ISO_DATETIME).all():
        utc = bool(text.str.contains(ISO_OFFSET).any())
        try:
            parsed = pd.to_datetime(text, format="ISO8601", utc=utc)
        except (ValueError, OverflowError):
            return None
        if utc:
            parsed = parsed.dt.tz_localize(None)
        return parsed.astype("datetime64[ns]").reindex(column.index)
    return None


def infer_column_types(pd, df, skip):
    """mltable's infer_column_types over a combined delimited mini-batch: text columns that
    hold only booleans or only ISO-8601 dates become typed; the columns in `skip` (path
    columns, Path) stay text."""
    for name, dtype in df.dtypes.items():  # one look at the types, not a Series per column
        if name in skip or not (dtype == object or isinstance(dtype, pd.StringDtype)):
            continue
        typed = infer_column(pd, df[name])
        if typed is not None:
            df[name] = typed
    return df

# Exceptions that say the data is bad (undecodable, rows pandas refuses, not Parquet): reported
# without a traceback. pandas' ParserError and pyarrow's ArrowInvalid are ValueErrors, its IO
# errors OSErrors.
DATA_ERRORS = (ValueError, UnicodeError, OSError)


def added_columns(table, piece):
    """The columns batchfleet adds to a piece's rows, as (name, value), in order."""
    added = list((piece.get("path_columns") or {}).items())
    if table.get("include_path_column"):
        added.append(("Path", piece.get("url")))
    return added


def read_piece(pd, table, piece, reader):
    """One piece as a DataFrame: its rows (after skip / take), then its path columns and Path.

    Returns (frame, known): `known` is False when the piece had nothing to say about its
    columns (an empty file)."""
    try:
        df, known = reader(pd, table, piece)
    except InputError:
        raise
    except Exception as exc:
        url = piece.get("url") or piece.get("path")
        message = ("reading %s (this mini-batch's piece of it) failed: %s: %s"
                   % (url, type(exc).__name__, str(exc).strip()))
        details = None if isinstance(exc, DATA_ERRORS) else format_exc()
        raise InputError(message, exception=type(exc).__name__, traceback=details)
    skip, take = piece.get("skip_rows") or 0, piece.get("take_rows")
    added = added_columns(table, piece)
    if skip or take is not None:
        df = df.iloc[skip:] if take is None else df.iloc[skip:skip + take]
    if added:
        df = with_columns(pd, df, added)
    return df, known


TEXT_DTYPE = []


def text_dtype(pd):
    """pandas' default dtype for strings (str in 3.x, object before), found once."""
    if not TEXT_DTYPE:
        TEXT_DTYPE.append(pd.Series(["text"]).dtype)
    return TEXT_DTYPE[0]


def with_columns(pd, df, added):
    """`df` with the constant text columns `added` ((name, value) in order) after its own (a
    name it already has is replaced in place), built as one new frame: inserting the columns
    one by one costs pandas more than reading a small piece."""
    rows = len(df)
    text = text_dtype(pd)
    if not df.columns.is_unique or df.columns.nlevels > 1:  # one by one, as pandas adds them
        df = df.copy()
        for name, value in added:
            df[name] = pd.Series([value] * rows, index=df.index, dtype=text)
        return df
    columns = {name: df[name].array for name in df.columns}
    for name, value in added:
        columns[name] = pd.array([value] * rows, dtype=text)
    combined = pd.DataFrame(columns, index=df.index, copy=False)
    combined.columns.name = df.columns.name
    return combined


def combine(pd, frames, added):
    """Concatenate pieces, combining columns by name: the data columns in order of first
    appearance, then the `added` ones (path columns, Path)."""
    data, extra = [], []
    seen = set()
    for df in frames:
        for column in df.columns:
            if column not in seen:
                seen.add(column)
                (extra if column in added else data).append(column)
    if "Path" in extra:
        extra.remove("Path")
        extra.append("Path")
    columns = data + extra
    filled = [df for df in frames if len(df)]
    if not filled:
        # No rows: each column keeps the type of the first piece that has it.
        empty = {}
        for df in frames:
            for column in df.columns:
                if column not in empty:
                    empty[column] = df[column].iloc[0:0].reset_index(drop=True)
        return pd.DataFrame({column: empty[column] for column in columns})
    if len(filled) == 1:
        df = filled[0]
        index = df.index
        if not (isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1):
            df = df.reset_index(drop=True)
    else:
        df = pd.concat(filled, ignore_index=True, sort=False)
    if list(df.columns) != columns:
        df = df.reindex(columns=columns)
    return df


def apply_column_steps(pd, df, steps, known):
    """keep_columns / drop_columns in order. `known`: whether any piece said what its columns
    are; when none did (no pieces, only empty files) missing columns are no error: keep adds
    them empty, drop ignores them."""
    for step in steps:
        ((name, wanted),) = step.items()
        wanted = list(wanted)
        if name not in ("keep", "drop"):
            raise InputError("unknown column step %r (expected keep or drop)" % (name,))
        missing = [c for c in wanted if c not in df.columns]
        if missing and known:
            raise InputError(
                "%s_columns: this mini-batch has no column %s; its columns are: %s"
                % (name, ", ".join(repr(c) for c in missing),
                   ", ".join(repr(c) for c in df.columns) or "(none)"),
                exception="KeyError")
        if name == "keep":
            for column in missing:
                df[column] = pd.Series(dtype=object)
            keep = set(wanted)
            df = df[[c for c in df.columns if c in keep]]
        else:
            df = df.drop(columns=[c for c in wanted if c not in missing])
    return df


def read_table(table):
    """The tabular mini-batch `table` (a run request's `table`) as one pandas DataFrame."""
    pd = import_pandas()
    reader = READERS.get(table.get("format"))
    if reader is None:
        raise InputError("unknown table format %r (expected delimited, json_lines or parquet)"
                         % (table.get("format"),))
    frames = []
    added = set()
    known = False
    for piece in table.get("pieces") or []:
        df, piece_known = read_piece(pd, table, piece, reader)
        frames.append(df)
        added.update(name for name, _ in added_columns(table, piece))
        known = known or piece_known
    df = combine(pd, frames, added)
    if table.get("format") == "delimited" and table.get("infer_column_types", True):
        df = infer_column_types(pd, df, added)
    if not frames and table.get("include_path_column"):
        df["Path"] = pd.Series(dtype=text_dtype(pd))
    return apply_column_steps(pd, df, table.get("column_steps") or [], known)


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
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError("cannot load entry script %s" % path)
    module = importlib.util.module_from_spec(spec)
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


def main(argv):
    proto_in, proto_out = take_protocol_fds()
    guard_protocol_fds()
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
        # ImportError deep inside the user's imports or a failure of every batch.
        try:
            import_pandas()
        except InputError as exc:
            sys.stderr.write("batchfleet: %s\n" % exc)
            protocol.send("init_error", exception="ModuleNotFoundError", message=str(exc),
                          traceback=None)
            return 1
        except BaseException as exc:  # pandas is there but broken (e.g. a numpy mismatch)
            sys.stderr.write(format_exc())
            protocol.send("init_error", **exception_fields(exc))
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
        if msg_type == "run":
            serve_run(protocol, module, pass_context, request)
        else:
            serve_shutdown(protocol, module)
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
