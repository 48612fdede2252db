"""batchfleet entry-script driver, tabular half (protocol v1): a `run` request's `table` read
into one pandas DataFrame. Installed beside the driver (batchfleet_driver_table_v1.py), which
imports it; it imports nothing of the driver's.

pandas is imported only when a table is read (or when BATCHFLEET_TABULAR=1 makes the driver
import it before the entry script), pyarrow only to read Parquet pieces: file-list jobs never
import either. See docs/entry-protocol.md for what a table request holds.

Importing this module costs a file-list runtime nothing beyond os and sys: `re` and `json`
(about 10 ms of an interpreter's start between them) are imported where a table needs them.
"""

import os
import sys

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


def broken_package_message(package, why, exc):
    return ("this job reads %s; importing %s in the worker's Python (%s) failed: %s: %s"
            % (why, package, sys.executable, type(exc).__name__, exc))


def import_pandas():
    """pandas, or an InputError that says how to get it when it is not installed, or what its
    import raised when it is there but fails to import (a dependency missing, a numpy it was
    not built for): an ImportError for the job, whatever pandas raised, with the traceback."""
    why = "tabular data (an mltable input)"
    try:
        import pandas
    except ModuleNotFoundError as exc:
        if exc.name != "pandas":
            raise InputError(broken_package_message("pandas", why, exc),
                             exception="ImportError", traceback=format_exc())
        raise InputError(missing_package_message("pandas", why), exception=type(exc).__name__)
    except Exception as exc:
        raise InputError(broken_package_message("pandas", why, exc), exception="ImportError",
                         traceback=format_exc())
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
        import re
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
        return read_csv(pd, path, options, header), True
    except pd.errors.EmptyDataError:  # only blank lines
        return pd.DataFrame(), False


class Columns:
    """A piece's columns as the parser gave them, before they are a frame: flat, unique names,
    each array `rows` long. For a small piece pd.read_csv's own frame (a new column index, each
    column checked again) costs twice what parsing does, and one_piece builds a frame anyway."""

    __slots__ = ("names", "arrays", "rows")

    def __init__(self, names, arrays, rows):
        self.names, self.arrays, self.rows = names, arrays, rows

    def __len__(self):
        return self.rows

    def frame(self, pd):
        """The frame pd.read_csv makes of them, on the job's shared column index."""
        return frame_of(pd, self.names, self.arrays, self.rows, None)


def frame(pd, df):
    """A piece's rows as a DataFrame."""
    return df.frame(pd) if isinstance(df, Columns) else df


def read_csv(pd, path, options, header):
    """pd.read_csv(path, **options), its columns named Column1.. when the file has no header:
    the parser's Columns, taken from its engine. Anything else (a parsed index, a dtype option,
    a pandas without the engine) is the frame read_csv makes."""
    if "dtype" in options:
        return header_names(pd.read_csv(path, **options), header)
    with pd.read_csv(path, iterator=True, **options) as reader:
        read = getattr(getattr(reader, "_engine", None), "read", None)
        if read is None:
            return header_names(reader.read(), header)
        index, columns, arrays = read(None)
    if index is None and arrays and len(arrays) == len(columns) == len(set(columns)) \
            and all(name in arrays for name in columns):
        values = [arrays[name] for name in columns]
        rows = len(values[0])
        if all(len(value) == rows for value in values):
            names = list(columns) if header else column_names(len(columns))
            return Columns(names, values, rows)
    # What TextFileReader.read makes when no dtype is asked for.
    if index is None and arrays:
        index = pd.RangeIndex(len(next(iter(arrays.values()))))
    return header_names(pd.DataFrame(arrays, columns=columns, index=index, copy=False), header)


def column_names(count):
    """mltable's names for the columns of a file without a header."""
    return ["Column%d" % (i + 1) for i in range(count)]


def header_names(df, header):
    if not header:
        df.columns = column_names(len(df.columns))
    return df


def read_json_lines(pd, table, piece):
    import json
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
# ISO-8601 dates and datetimes, and a datetime's offset at its end (compiled by pandas' str
# methods, which cache them).
ISO_DATETIME = (r"\d{4}-\d{2}-\d{2}"
                r"(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d{1,9})?)?"
                r"(?:Z|[+-]\d{2}(?::?\d{2})?)?)?")
ISO_OFFSET = r"(?:Z|[+-]\d{2}(?::?\d{2})?)$"


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
    import re
    if re.fullmatch(ISO_DATETIME, first) and text.str.fullmatch(ISO_DATETIME).all():
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


def read_rows(pd, table, piece, reader):
    """One piece's rows (after skip / take) as a DataFrame or Columns, without the columns
    batchfleet adds.

    Returns (rows, known): `known` is False when the piece had nothing to say about its
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
    if skip or take is not None:
        df = frame(pd, df)
        df = df.iloc[skip:] if take is None else df.iloc[skip:skip + take]
    return df, known


def format_exc():
    """traceback.format_exc(), traceback imported only when something failed."""
    import traceback
    return traceback.format_exc()


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


def one_piece(pd, df, added, infer):
    """The mini-batch of the one piece `df` (a DataFrame with flat and unique column names, or
    Columns) and the constant text columns `added` ((name, value) in order): the frame that
    with_columns, combine and infer_column_types make of it, built in one go. For a small piece
    (a partition) pandas' cost per call, not the data, is what counts: this takes one pass over
    the columns and one new frame where that way takes a frame, a column index, dtypes and a
    reindex."""
    values = dict(added)  # a name added twice: its last value, at its first place
    parsed = isinstance(df, Columns)
    own_names = df.names if parsed else df.columns
    own = set(own_names)
    names, arrays = [], []
    for name, array in zip(df.names, df.arrays) if parsed else column_arrays(df):
        if name in values:  # replaced by the added column, and never inferred
            continue
        dtype = array.dtype
        if infer and (dtype == object or isinstance(dtype, pd.StringDtype)):
            typed = infer_column(pd, pd.Series(array, copy=False) if parsed else df[name])
            if typed is not None:
                array = typed.array
        names.append(name)
        arrays.append(array)
    # The added columns after the data ones, as combine orders them: those the piece had where
    # it had them, then the new ones, Path last.
    extra = [name for name in own_names if name in values]
    extra += [name for name in values if name not in own]
    if "Path" in values:
        extra.remove("Path")
        extra.append("Path")
    rows = len(df)
    for name in extra:
        names.append(name)
        arrays.append(constant_column(pd, values[name], rows))
    return frame_of(pd, names, arrays, rows, None if parsed else df.columns.name)


def column_arrays(df):
    """(name, values) of each of df's columns (flat, unique names). pandas' private
    _iter_column_arrays gives the values without making a Series per column, which costs more
    than the rest of a small piece's columns; the public way where pandas lacks it."""
    arrays = getattr(df, "_iter_column_arrays", None)
    if arrays is None:
        return [(name, column.array) for name, column in df.items()]
    return zip(df.columns, arrays())


# The constant text columns made so far, by value and length: a job's partitions share most
# path values (a store's every brand), and a copy costs far less than making one. Each frame
# gets a copy of its own, so that run() changing one never shows in another.
CONSTANT_COLUMNS = {}
CONSTANT_COLUMNS_MAX = 256


def constant_column(pd, value, rows):
    """A text column of `rows` times `value`, pandas' default string type."""
    key = (value, rows)
    try:
        column = CONSTANT_COLUMNS.get(key)
    except TypeError:  # a value that cannot be hashed
        key, column = None, None
    if column is None:
        text = text_dtype(pd)
        # pandas' own string arrays take the ExtensionArray interface's constructor directly.
        array_type = getattr(text, "construct_array_type", None)
        constant = array_type()._from_sequence if array_type else pd.array
        column = constant([value] * rows, dtype=text)
        if key is not None:
            if len(CONSTANT_COLUMNS) >= CONSTANT_COLUMNS_MAX:
                CONSTANT_COLUMNS.clear()
            CONSTANT_COLUMNS[key] = column
    return column.copy()


# Column indexes of one-piece mini-batches by their names and name: a job's partitions mostly
# share one, and a frame with a new index builds the index's hash table again on the first
# column run() looks up.
COLUMN_INDEXES = {}
COLUMN_INDEXES_MAX = 64


def frame_of(pd, names, arrays, rows, name):
    """A frame of the columns `arrays` named `names` (flat, unique) on rows 0..rows-1, its
    column index named `name`: what pd.DataFrame(dict(zip(names, arrays))) makes, with a
    column index shared with the job's earlier mini-batches of the same columns."""
    index = shared_column_index(pd, names, name)
    from_arrays = getattr(pd.DataFrame, "_from_arrays", None)
    if index is None or from_arrays is None:
        combined = pd.DataFrame(dict(zip(names, arrays)), copy=False)
        combined.columns.name = name
        return combined
    # A view of the shared index: a name of its own (which run() may set), the same hash table.
    return from_arrays(arrays, columns=index.view(), index=pd.RangeIndex(rows))


def shared_column_index(pd, names, name):
    """The column index pandas infers for `names`, named `name`, made once per job; None for
    names it would not take as they are (tuples make a MultiIndex) or cannot be keys."""
    if any(isinstance(n, tuple) for n in names):
        return None
    key = (tuple(names), tuple(type(n) for n in names), name)
    try:
        index = COLUMN_INDEXES.get(key)
    except TypeError:  # a name that cannot be hashed
        return None
    if index is None:
        if len(COLUMN_INDEXES) >= COLUMN_INDEXES_MAX:
            COLUMN_INDEXES.clear()
        index = pd.Index(names, name=name)
        COLUMN_INDEXES[key] = index
    return index


def read_table(table):
    """The tabular mini-batch `table` (a run request's `table`) as one pandas DataFrame."""
    pd = import_pandas()
    reader = READERS.get(table.get("format"))
    if reader is None:
        raise InputError("unknown table format %r (expected delimited, json_lines or parquet)"
                         % (table.get("format"),))
    infer = table.get("format") == "delimited" and table.get("infer_column_types", True)
    steps = table.get("column_steps") or []
    pieces = table.get("pieces") or []
    frames = []
    added = set()
    known = False
    for piece in pieces:
        df, piece_known = read_rows(pd, table, piece, reader)
        columns = added_columns(table, piece)
        if columns and len(pieces) == 1 and len(df) and (isinstance(df, Columns) or (
                df.columns.nlevels == 1 and len(set(df.columns)) == len(df.columns))):
            # The usual mini-batch of a partitioned table: one piece and its path columns.
            return apply_column_steps(pd, one_piece(pd, df, columns, infer), steps, piece_known)
        df = frame(pd, df)
        if columns:
            df = with_columns(pd, df, columns)
        frames.append(df)
        added.update(name for name, _ in columns)
        known = known or piece_known
    df = combine(pd, frames, added)
    if infer:
        df = infer_column_types(pd, df, added)
    if not frames and table.get("include_path_column"):
        df["Path"] = pd.Series(dtype=text_dtype(pd))
    return apply_column_steps(pd, df, steps, known)
