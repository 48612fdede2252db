//! Entry-script runtimes: one long-lived process per concurrency slot, spoken to over the line
//! protocol of docs/entry-protocol.md.
//!
//! The process outlives many mini-batches so that `init()` (loading a model, opening a
//! connection) runs once per process, as in Azure. It is disposable all the same: after a
//! timeout or a crash the caller drops it and starts a fresh one.

mod answer;
pub mod environment;
mod error;
mod interpreter;
mod output_lines;
mod process;
pub mod protocol;
pub mod read_only;
mod spawn;
mod stderr;
mod tree;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use answer::{Running, AHEAD_DEPTH, AHEAD_GRACE, AHEAD_HOLD};
pub use error::{RuntimeError, UserFailure};
pub(crate) use interpreter::announce;
pub use interpreter::{prepare_interpreter, resolve_interpreter};
pub use process::RuntimeProcess;
pub use protocol::{
    MiniBatchContext, TablePieceRequest, TableRequest, TableRequestFormat, UserFailureKind,
};
pub use tree::{adopt_orphans, TREE_ENV};

/// The Python driver that loads an entry script and speaks the protocol.
pub const PYTHON_DRIVER: &str = include_str!("driver.py");

/// The file name the driver is installed under (versioned, so an old copy is never reused).
pub const DRIVER_FILE_NAME: &str = "batchfleet_driver_v1.py";

/// The driver's tabular half (a `run` request's `table` read into a DataFrame), which the
/// driver imports from beside itself.
pub const PYTHON_DRIVER_TABLE: &str = include_str!("driver_table.py");

/// The file name the driver's tabular half is installed under, beside the driver.
pub const DRIVER_TABLE_FILE_NAME: &str = "batchfleet_driver_table_v1.py";

/// `azureml_user.parallel_run` (Azure's `EntryScript` helper) as batchfleet provides it.
pub const ENTRY_SCRIPT_MODULE: &str = include_str!("entry_script.py");

/// The folder beside the driver that holds `azureml_user/parallel_run.py`; the driver puts it
/// last on `sys.path`, so a script's own `azureml_user` comes first. `azureml_user` has no
/// `__init__.py` (a namespace package), so that a script's own namespace package of that name
/// is not shadowed either.
pub const USER_PACKAGES_DIR: &str = "batchfleet_user_packages_v1";

/// How a runtime starts the installed driver: `python -c DRIVER_START <driver folder> <code
/// folder> <entry script> [args]` imports it as a module, so the interpreter loads the bytecode
/// the worker had it compile ([`prepare_interpreter`]) instead of compiling the driver's source
/// at every start (as `python driver.py` does); the driver imports its tabular half
/// ([`DRIVER_TABLE_FILE_NAME`]) while its folder is on the path, from bytecode the same way. The driver's folder leaves `sys.path` again,
/// and the driver puts the code folder first, as before.
pub const DRIVER_START: &str = "import sys; sys.path.insert(0, sys.argv.pop(1)); \
    import batchfleet_driver_v1 as driver; del sys.path[0]; sys.exit(driver.main(sys.argv))";

/// The environment variable (value `1`) that tells the driver the job reads tabular data, so
/// it imports pandas before loading the entry script and reports a missing pandas as an init
/// error instead of failing every batch.
pub const TABULAR_ENV: &str = "BATCHFLEET_TABULAR";

/// The environment variable that names, to the driver, the input folders its runtime sees
/// read-only (joined with `:`): a write refused there (`EROFS`) is the script's failure, not the
/// storage's.
pub const READ_ONLY_ENV: &str = "BATCHFLEET_READ_ONLY_INPUTS";

/// What `azureml_user.parallel_run.EntryScript` reads (see `entry_script.py`): the job's
/// `logging_level`, the worker's id (`node_id`), the runtime's name (`process_name`, as its
/// user log is named), the folder for the script's own log files (`log_dir`) and the
/// runtime's working folder (`working_dir`, set by [`RuntimeProcess::start`]).
pub const LOGGING_LEVEL_ENV: &str = "BATCHFLEET_LOGGING_LEVEL";
pub const NODE_ID_ENV: &str = "BATCHFLEET_NODE_ID";
pub const PROCESS_NAME_ENV: &str = "BATCHFLEET_PROCESS_NAME";
pub const LOG_DIR_ENV: &str = "BATCHFLEET_LOG_DIR";
pub const WORKING_DIR_ENV: &str = "BATCHFLEET_WORKING_DIR";

/// Lines of the runtime's stderr kept in memory for crash reports.
pub const STDERR_TAIL_LINES: usize = 50;

/// Write the bundled driver into `dir` and return its path.
///
/// Written to a temporary name and renamed, so that concurrent installs (several workers on one
/// scratch folder) never leave a half-written driver for a starting runtime to read.
/// Its tabular half ([`DRIVER_TABLE_FILE_NAME`]) and the `azureml_user` package
/// ([`USER_PACKAGES_DIR`]) go beside it, first: the driver imports the one and puts the other
/// on `sys.path`.
pub fn install_driver(dir: &Path) -> std::io::Result<PathBuf> {
    let package = dir.join(USER_PACKAGES_DIR).join("azureml_user");
    install_file(&package, "parallel_run.py", ENTRY_SCRIPT_MODULE)?;
    install_file(dir, DRIVER_TABLE_FILE_NAME, PYTHON_DRIVER_TABLE)?;
    install_file(dir, DRIVER_FILE_NAME, PYTHON_DRIVER)
}

/// Write `text` to `dir/name` through a temporary file renamed into place.
fn install_file(dir: &Path, name: &str, text: &str) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let target = dir.join(name);
    let mut temp = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut temp, text.as_bytes())?;
    temp.persist(&target).map_err(|e| e.error)?;
    Ok(target)
}

/// How to start one runtime process.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeConfig {
    /// The Python interpreter (`python3` unless configured).
    pub python: PathBuf,
    /// The installed driver (see [`install_driver`]).
    pub driver: PathBuf,
    /// The job's code folder; put first on `sys.path`.
    pub code_dir: PathBuf,
    /// The entry script, relative to `code_dir`.
    pub entry_script: String,
    /// `sys.argv[1:]` of the entry script.
    pub script_args: Vec<String>,
    /// Added to the worker's own environment, of which the runtime inherits what
    /// [`environment`] lets through under `storage_keys`.
    pub env: BTreeMap<String, String>,
    /// Whether the worker's store credentials reach the runtime ([`environment`]).
    pub storage_keys: environment::StorageKeys,
    /// The process runs in a fresh temporary folder created under this one (removed when the
    /// process stops), so relative paths never collide between processes.
    pub work_dir: PathBuf,
    /// The process's stderr (the user's prints and logs) is appended here.
    pub log_path: PathBuf,
    /// How long loading the script and `init()` may take.
    pub init_timeout: Duration,
    /// Local input folders the process sees read-only, at their own paths, when this worker
    /// can make it so ([`read_only`]; [`RuntimeProcess::inputs_read_only`] tells).
    pub read_only: Vec<PathBuf>,
}

/// One mini-batch for [`RuntimeProcess::run`].
#[derive(Debug, Clone, PartialEq)]
pub struct RunRequest {
    pub batch_id: String,
    /// Local file paths (empty for a tabular mini-batch).
    pub items: Vec<String>,
    pub context: MiniBatchContext,
    /// Local file the result rows are written to.
    pub output: PathBuf,
    /// Rows of up to this many bytes may come back with the answer instead
    /// ([`RunSuccess::attached_rows`]); `None`: always in `output`.
    pub attach_max: Option<u64>,
    /// A tabular mini-batch: `run()` gets its pieces as one pandas DataFrame.
    pub table: Option<TableRequest>,
}

/// How a `run()` call ended, when the process itself is still healthy.
#[derive(Debug, Clone, PartialEq)]
pub enum RunOutcome {
    Succeeded(RunSuccess),
    /// `run()` raised or returned the wrong type; the process can serve the next batch.
    Failed(UserFailure),
}

/// What a successful `run()` reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSuccess {
    /// The length of `run()`'s return value (not capped).
    pub items_out: u64,
    /// Rows `run()` returned (a list's elements, a DataFrame's rows).
    pub rows: u64,
    /// Lines in the output file, as the worker counted them: more than `rows` when rows hold
    /// line breaks (each becomes a row of the aggregated output); never fewer.
    pub lines: u64,
    /// The DataFrame header line, when `run()` returned a DataFrame.
    pub header: Option<String>,
    /// Tabular mini-batches: the rows of the DataFrame `run()` got (the batch's item count);
    /// `None` for file lists.
    pub items_in: Option<u64>,
    /// The rows, when the runtime sent them with its answer (the request allowed it and they
    /// fit): the output file was then not written.
    pub attached_rows: Option<String>,
}
