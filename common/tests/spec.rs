//! The job spec parser against Azure-style YAML: what parses, what it resolves to, and what each
//! mistake is reported as (file, line, column, key, value, allowed range).

use std::path::{Path, PathBuf};

use batchfleet_common::job::{
    ArgPiece, InputKind, InputMode, InputValue, LoggingLevel, MiniBatchSize, ProgramArgs, ScriptArg,
};
use batchfleet_common::spec::{self, parse_job_str, ParsedJob, SpecError};
use batchfleet_common::{ErrorKind, Retry};
use serde_json::json;

/// A minimal valid job; line numbers below count on its 10 lines.
const BASE: &str = "\
type: parallel
inputs:
  data:
    type: uri_folder
    path: ./data
input_data: ${{inputs.data}}
task:
  type: run_function
  code: ./src
  entry_script: score.py
";

fn parse(yaml: &str) -> Result<ParsedJob, SpecError> {
    parse_job_str(yaml, Path::new("/jobs/job.yaml"))
}

fn ok(yaml: &str) -> ParsedJob {
    parse(yaml).unwrap_or_else(|e| panic!("expected the spec to parse, got: {e}"))
}

fn err(yaml: &str) -> SpecError {
    match parse(yaml) {
        Ok(parsed) => panic!("expected an error, parsed: {:?}", parsed.job),
        Err(e) => e,
    }
}

/// `BASE` with `extra` appended (top-level keys, starting at line 11).
fn with(extra: &str) -> String {
    format!("{BASE}{extra}")
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/spec").join(name)
}

fn fixture_url(rel: &str) -> String {
    url::Url::from_file_path(fixture(rel)).unwrap().to_string()
}

fn assert_at(e: &SpecError, line: usize, column: usize, key: &str) {
    assert_eq!((e.line, e.column, e.key.as_deref()), (Some(line), Some(column), Some(key)), "{e}");
}

fn assert_mentions(e: &impl std::fmt::Display, parts: &[&str]) {
    let text = e.to_string();
    for part in parts {
        assert!(text.contains(part), "`{part}` missing from: {text}");
    }
}

// ---- whole files ------------------------------------------------------------------------------

#[test]
fn full_azure_example_parses_every_field() {
    let parsed = spec::load_job_file(&fixture("full.yaml"), &spec::Datastores::default()).unwrap();
    assert_eq!(parsed.warnings, vec![]);
    let job = parsed.job;
    assert_eq!(job.name, "iris-batch-scoring");
    assert_eq!(job.display_name.as_deref(), Some("Iris batch scoring"));
    assert_eq!(job.description.as_deref(), Some("Score the iris files in parallel."));
    assert_eq!(job.experiment_name.as_deref(), Some("batch-scoring"));
    assert_eq!(job.tags.get("version").map(String::as_str), Some("3"));
    assert_eq!(job.compute.as_deref(), Some("azureml:cpu-cluster"));
    assert_eq!(job.spec_file, fixture("full.yaml").display().to_string());

    assert_eq!(job.input.name, "job_data_path");
    assert_eq!(job.input.kind, InputKind::UriFolder);
    assert_eq!(job.input.mode, InputMode::RoMount);
    assert_eq!(job.input.url, fixture_url("data/iris"));
    assert_eq!(job.inputs.len(), 3);
    assert_eq!(job.inputs["job_data_path"], InputValue::Data(job.input.clone()));
    assert_eq!(job.inputs["model_name"], InputValue::Literal(json!("iris-model")));
    assert_eq!(job.inputs["score_threshold"], InputValue::Literal(json!(0.5)));

    assert_eq!(job.outputs["job_output_path"].url, Some(fixture_url("out")));
    assert_eq!(job.outputs["job_output_path"].mode.as_deref(), Some("rw_mount"));
    assert_eq!(job.outputs["scratch"].url, None);
    assert_eq!(job.outputs["scratch"].kind, "uri_folder");

    assert_eq!(job.mini_batch_size, MiniBatchSize::Bytes(10 * 1024));
    assert_eq!(job.partition_keys, ["region", "store"]);
    assert_eq!(job.instance_count, 2);
    assert_eq!(job.max_concurrency_per_instance, 4);
    assert_eq!(job.mini_batch_error_threshold, 5);
    assert_eq!(job.logging_level, LoggingLevel::Debug);
    assert_eq!(
        (job.retry.max_retries, job.retry.timeout_secs, job.retry.max_deliveries()),
        (3, 120, 4)
    );
    assert_eq!(job.environment_variables["RETRIES"], "3");
    assert_eq!(job.environment_variables["VERBOSE"], "true");
    assert_eq!(job.environment_variables["EXAMPLE_NAME"], "iris");

    let task = &job.task;
    assert_eq!(task.code, fixture_url("src"));
    assert_eq!(task.entry_script, "scoring/score.py");
    assert_eq!(task.append_row_to, Some(fixture_url("out")));
    assert_eq!(task.environment.as_ref().unwrap()["conda_file"], json!("./env/conda.yaml"));
    assert_eq!(
        task.program_args,
        ProgramArgs {
            error_threshold: 10,
            allowed_failed_percent: 25.5,
            task_overhead_timeout_secs: 45,
            progress_update_timeout_secs: Some(900),
            first_task_creation_timeout_secs: 300,
            resource_monitor_interval_secs: 0,
            copy_logs_to_parent: true,
            append_row_dataframe_header: true,
            isolate_poison_items: false,
        }
    );
    assert_eq!(
        task.script_args,
        ["--model", "iris-model", "--threshold", "0.5", "--label", "setosa versicolor"]
    );
}

#[test]
fn defaults_apply_when_keys_are_omitted() {
    let parsed = ok(BASE);
    let job = parsed.job;
    assert_eq!(job.name, "job", "the file's stem");
    assert_eq!(job.spec_file, "/jobs/job.yaml");
    assert_eq!(job.mini_batch_size, MiniBatchSize::Count(1));
    assert!(job.partition_keys.is_empty());
    assert_eq!(job.instance_count, 1);
    let cores = std::thread::available_parallelism().unwrap().get() as u32;
    assert_eq!(job.max_concurrency_per_instance, cores);
    assert_eq!(job.mini_batch_error_threshold, -1);
    assert_eq!(job.logging_level, LoggingLevel::Info);
    assert_eq!(
        (job.retry.max_retries, job.retry.timeout_secs, job.retry.max_deliveries()),
        (2, 60, 3)
    );
    assert_eq!(job.task.program_args, ProgramArgs::default());
    assert!(job.task.script_args.is_empty());
    assert_eq!(job.task.append_row_to, None);
    assert_eq!(job.task.environment, None);
    assert_eq!(job.input.mode, InputMode::RoMount);
    assert!(job.outputs.is_empty() && job.tags.is_empty() && job.environment_variables.is_empty());
    assert_eq!((job.display_name, job.description, job.compute), (None, None, None));
}

#[test]
fn relative_paths_resolve_against_the_yaml_folder() {
    let job = ok(BASE).job;
    assert_eq!(job.input.url, "file:///jobs/data");
    assert_eq!(job.task.code, "file:///jobs/src");

    let yaml = BASE.replace("./data", "../shared/./in").replace("./src", "/opt/code");
    let job = parse_job_str(&yaml, Path::new("/a/b/job.yaml")).unwrap().job;
    assert_eq!(job.input.url, "file:///a/shared/in");
    assert_eq!(job.task.code, "file:///opt/code");

    let job = ok(&BASE.replace("./data", "s3://bucket/prefix")).job;
    assert_eq!(job.input.url, "s3://bucket/prefix");
}

#[test]
fn a_relative_spec_file_resolves_against_the_current_folder() {
    let job = parse_job_str(BASE, Path::new("job.yaml")).unwrap().job;
    let cwd = std::env::current_dir().unwrap();
    assert_eq!(job.input.url, url::Url::from_file_path(cwd.join("data")).unwrap().to_string());
    assert_eq!(job.spec_file, "job.yaml");
}

#[test]
fn unmapped_azureml_paths_say_which_line_to_add() {
    let e = err(&BASE.replace("./data", "azureml://datastores/workspaceblobstore/paths/iris"));
    assert_at(&e, 5, 11, "inputs.data.path");
    assert_mentions(
        &e,
        &[
            "the datastore `workspaceblobstore`",
            "`  workspaceblobstore: az://<container>/<folder>`",
        ],
    );
}

#[test]
fn unmapped_asset_references_say_which_line_to_add() {
    let e = err(&BASE.replace("./src", "azureml:my-code:3"));
    assert_at(&e, 9, 9, "task.code");
    assert_mentions(&e, &["`azureml:my-code:3` is not mapped", "`  my-code:3: az://"]);
}

#[test]
fn missing_files_are_named() {
    let e = spec::load_job_file(Path::new("/no/such/job.yaml"), &spec::Datastores::default())
        .unwrap_err();
    assert_eq!(e.file, "/no/such/job.yaml");
    assert_eq!(e.line, None);
    assert_mentions(&e, &["/no/such/job.yaml: cannot read"]);
}

#[test]
fn empty_files_say_what_is_expected() {
    let e = err("# nothing here\n");
    assert_mentions(&e, &["/jobs/job.yaml: ", "empty", "type: parallel"]);
}

// ---- error messages ---------------------------------------------------------------------------

#[test]
fn errors_display_as_file_line_column_key_message() {
    let e = err(&with("retry_settings:\n  timeout: 0\n"));
    assert_eq!(e.to_string(), "/jobs/job.yaml:12:12: retry_settings.timeout: 0 is out of range; allowed: 1 to 259200 seconds");
    assert_eq!(e.kind(), ErrorKind::Config);
    assert_eq!(e.retry(), Retry::Permanent);
}

#[test]
fn timeout_above_three_days_is_out_of_range() {
    let e = err(&with("retry_settings:\n  timeout: 259201\n"));
    assert_at(&e, 12, 12, "retry_settings.timeout");
    assert_mentions(&e, &["259201 is out of range; allowed: 1 to 259200 seconds"]);
    assert_eq!(ok(&with("retry_settings:\n  timeout: 259200\n")).job.retry.timeout_secs, 259_200);
}

#[test]
fn negative_max_retries_is_out_of_range() {
    let e = err(&with("retry_settings:\n  max_retries: -1\n"));
    assert_at(&e, 12, 16, "retry_settings.max_retries");
    assert_mentions(&e, &["-1 is out of range; allowed: 0 or more"]);
    assert_eq!(ok(&with("retry_settings:\n  max_retries: 0\n")).job.retry.max_deliveries(), 1);
}

#[test]
fn unknown_keys_suggest_the_key_meant() {
    let e = err(&with("mini_batch_sise: 10\n"));
    assert_at(&e, 11, 1, "mini_batch_sise");
    assert_mentions(&e, &["unknown key `mini_batch_sise`; did you mean `mini_batch_size`?"]);

    let e = err(&with("retry_settings:\n  timout: 10\n"));
    assert_at(&e, 12, 3, "retry_settings.timout");
    assert_mentions(&e, &["did you mean `timeout`?"]);

    let e = err(&with("colour: blue\n"));
    assert_mentions(&e, &["unknown key `colour`; allowed here: ", "`mini_batch_size`"]);
}

#[test]
fn wrong_types_quote_what_was_found() {
    let e = err(&with("max_concurrency_per_instance: abc\n"));
    assert_at(&e, 11, 31, "max_concurrency_per_instance");
    assert_mentions(&e, &["expected an integer, found `abc`"]);

    let e = err(&with("resources: 2\n"));
    assert_mentions(&e, &["resources: expected a mapping, found `2`"]);

    let e = err(&with("partition_keys: region\n"));
    assert_mentions(&e, &["expected a list of text, found `region`"]);
}

#[test]
fn huge_fleet_sizes_are_refused_by_key() {
    let e = err(&with("resources:\n  instance_count: 2147483648\n"));
    assert_eq!(e.key.as_deref(), Some("resources.instance_count"), "{e}");
    assert_mentions(&e, &["2147483648 is out of range; allowed: 1 to 1000"]);
    let e = err(&with("max_concurrency_per_instance: 1000000\n"));
    assert_eq!(e.key.as_deref(), Some("max_concurrency_per_instance"), "{e}");
    assert_mentions(&e, &["1000000 is out of range; allowed: 1 to 1024"]);
    let job =
        ok(&with("resources:\n  instance_count: 1000\nmax_concurrency_per_instance: 1024\n")).job;
    assert_eq!((job.instance_count, job.max_concurrency_per_instance), (1000, 1024));
}

#[test]
fn other_ranges_are_checked() {
    assert_mentions(
        &err(&with("resources:\n  instance_count: 0\n")),
        &["0 is out of range; allowed: 1 to 1000"],
    );
    assert_mentions(&err(&with("max_concurrency_per_instance: 0\n")), &["allowed: 1 to 1024"]);
    assert_mentions(
        &err(&with("mini_batch_error_threshold: -2\n")),
        &["-2 is out of range; allowed: -1 or more"],
    );
    assert_mentions(&err(&with("error_threshold: -5\n")), &["error_threshold: -5 is out of range"]);
    let job = ok(&with("resources:\n  instance_count: 3\n  instance_type: Standard_D4\n  shm_size: 2g\n  properties: {a: 1}\n")).job;
    assert_eq!(job.instance_count, 3);
}

#[test]
fn mini_batch_sizes_are_counts_or_binary_sizes() {
    let size = |raw: &str| ok(&with(&format!("mini_batch_size: {raw}\n"))).job.mini_batch_size;
    assert_eq!(size("\"10kb\""), MiniBatchSize::Bytes(10_240));
    assert_eq!(size("\"1MB\""), MiniBatchSize::Bytes(1_048_576));
    assert_eq!(size("10mb"), MiniBatchSize::Bytes(10 << 20));
    assert_eq!(size("5"), MiniBatchSize::Count(5));
    assert_eq!(size("\"5\""), MiniBatchSize::Count(5));

    for bad in ["\"10 kb\"", "10k", "1.5mb", "0"] {
        let e = err(&with(&format!("mini_batch_size: {bad}\n")));
        assert_at(&e, 11, 18, "mini_batch_size");
        assert_mentions(&e, &[bad.trim_matches('"'), "allowed"]);
    }
    assert_eq!(spec::parse_mini_batch_size("2gb"), Ok(MiniBatchSize::Bytes(2 << 30)));
}

#[test]
fn logging_levels_are_checked_without_regard_to_case() {
    assert_eq!(ok(&with("logging_level: warning\n")).job.logging_level, LoggingLevel::Warning);
    let e = err(&with("logging_level: VERBOSE\n"));
    assert_at(&e, 11, 16, "logging_level");
    assert_mentions(
        &e,
        &["`VERBOSE` is not allowed; allowed: `DEBUG`, `INFO`, `WARNING`, `ERROR`, `CRITICAL`"],
    );
    assert_mentions(&err(&with("logging_level: WARN\n")), &["did you mean `WARNING`?"]);
}

#[test]
fn input_data_must_name_a_declared_data_input() {
    let e = err(&BASE.replace("${{inputs.data}}", "${{inputs.dta}}"));
    assert_at(&e, 6, 13, "input_data");
    assert_mentions(
        &e,
        &["`${{inputs.dta}}` names no input", "declared inputs: `data`", "did you mean `data`?"],
    );

    let e = err(&BASE.replace("${{inputs.data}}", "./data"));
    assert_mentions(&e, &["`./data` is not an input binding"]);

    let e = err(&with("")
        .replace("${{inputs.data}}", "${{inputs.n}}")
        .replace("inputs:\n", "inputs:\n  n: 5\n"));
    assert_mentions(&e, &["`${{inputs.n}}` is a literal value, not data"]);
}

#[test]
fn job_type_must_be_parallel_or_pipeline() {
    let e = err(&BASE.replace("type: parallel", "type: command"));
    assert_at(&e, 1, 7, "type");
    assert_mentions(&e, &["`command` jobs are not supported; allowed: `parallel`"]);

    let e = err(&BASE.replace("type: parallel\n", ""));
    assert_at(&e, 1, 1, "type");
    assert_mentions(&e, &["is required"]);
}

#[test]
fn task_type_must_be_run_function() {
    let e = err(&BASE.replace("type: run_function", "type: command"));
    assert_at(&e, 8, 9, "task.type");
    assert_mentions(&e, &["`command` is not allowed; allowed: `run_function`"]);
}

#[test]
fn missing_required_keys_point_at_their_parent() {
    let e = err(&BASE.replace("  code: ./src\n", ""));
    assert_at(&e, 7, 1, "task.code");
    assert_mentions(&e, &["is required under `task`"]);

    let e = err(&BASE.replace("  entry_script: score.py\n", "  entry_script:\n"));
    assert_at(&e, 10, 3, "task.entry_script");
    assert_mentions(&e, &["needs a value"]);

    let e = err(&BASE.replace("input_data: ${{inputs.data}}\n", ""));
    assert_at(&e, 1, 1, "input_data");
}

#[test]
fn entry_scripts_may_not_leave_the_code_folder() {
    let e = err(&BASE.replace("score.py", "../score.py"));
    assert_at(&e, 10, 17, "task.entry_script");
    assert_mentions(&e, &["`../score.py` is not inside `task.code`"]);
}

#[test]
fn yaml_syntax_errors_carry_the_parser_position() {
    let e = err("type: parallel\ninputs:\n  data: [1, 2\ntask: {}\n");
    assert_eq!(e.key, None);
    assert!(e.line.unwrap() >= 3, "{e}");
    assert_mentions(&e, &["/jobs/job.yaml:", "not valid YAML"]);

    let e = err(&with("type: parallel\n"));
    assert_eq!((e.line, e.column), (Some(11), Some(1)));
    assert_mentions(&e, &["duplicate key `type`; it is first given at line 1"]);
}

// ---- outputs and append_row_to ------------------------------------------------------------------

#[test]
fn append_row_to_binds_an_output_or_takes_a_path() {
    let yaml =
        with("outputs:\n  scores:\n    type: uri_file\n    path: out/scores.csv\n  later:\n");
    let bound = yaml.replace(
        "entry_script: score.py",
        "entry_script: score.py\n  append_row_to: ${{outputs.scores}}",
    );
    assert_eq!(ok(&bound).job.task.append_row_to.as_deref(), Some("file:///jobs/out/scores.csv"));

    let unset = yaml.replace(
        "entry_script: score.py",
        "entry_script: score.py\n  append_row_to: ${{outputs.later}}",
    );
    let mut unset = ok(&unset).job;
    assert_eq!(unset.task.append_row_to, None, "no path: the producer picks the job root");
    assert_eq!(unset.task.append_row_to_output.as_deref(), Some("later"));
    unset.fill_default_outputs(&url::Url::parse("s3://b/jobs/j-1/").unwrap());
    assert_eq!(
        unset.task.append_row_to.as_deref(),
        Some("s3://b/jobs/j-1/outputs/later/"),
        "Azure writes parallel_run_step.txt in the bound output's folder"
    );

    let path = BASE.replace(
        "entry_script: score.py",
        "entry_script: score.py\n  append_row_to: gs://b/p/rows.txt",
    );
    assert_eq!(ok(&path).job.task.append_row_to.as_deref(), Some("gs://b/p/rows.txt"));

    let missing = BASE.replace(
        "entry_script: score.py",
        "entry_script: score.py\n  append_row_to: ${{outputs.nope}}",
    );
    let e = err(&missing);
    assert_at(&e, 11, 18, "task.append_row_to");
    assert_mentions(&e, &["`${{outputs.nope}}` names no output", "this job declares no outputs"]);
}

// ---- program arguments ------------------------------------------------------------------------

#[test]
fn data_bindings_in_program_arguments_stay_references_for_the_worker() {
    // Until issue 13 they became `file:///…` URLs here, and a pathless output was refused.
    let yaml = with_args(
        "--data ${{inputs.data}} --out=${{outputs.models}}/x --n ${{inputs.n}} --f ${{outputs.f}}",
    )
    .replace("input_data:", "  n: 5\noutputs:\n  models:\n  f: {type: uri_file}\ninput_data:");
    let job = ok(&yaml).job;
    assert_eq!(
        job.task.script_args,
        [
            ScriptArg::Text("--data".into()),
            ScriptArg::Template(vec![ArgPiece::Input("data".into())]),
            ScriptArg::Template(vec![
                ArgPiece::Text("--out=".into()),
                ArgPiece::Output("models".into()),
                ArgPiece::Text("/x".into()),
            ]),
            ScriptArg::Text("--n".into()),
            ScriptArg::Text("5".into()),
            ScriptArg::Text("--f".into()),
            ScriptArg::Template(vec![ArgPiece::Output("f".into())]),
        ]
    );
    let json = serde_json::to_value(&job.task.script_args).unwrap();
    assert_eq!(json[0], json!("--data"), "plain arguments stay plain strings in job.json");
    assert_eq!(json[1], json!([{"input": "data"}]));
}

#[test]
fn outputs_without_path_live_under_the_job_root() {
    let yaml = with("outputs:\n  models:\n  scores: {type: uri_file}\n  kept: {path: /keep}\n");
    let mut job = ok(&yaml).job;
    assert_eq!(job.outputs["models"].url, None);
    job.fill_default_outputs(&url::Url::parse("file:///runs/j-1/").unwrap());
    let urls: Vec<_> = job.outputs.values().map(|o| o.url.clone().unwrap()).collect();
    assert_eq!(
        urls,
        ["file:///keep", "file:///runs/j-1/outputs/models/", "file:///runs/j-1/outputs/scores"]
    );
}

#[test]
fn output_names_must_be_one_folder_name() {
    let e = err(&with("outputs:\n  a/b:\n"));
    assert_mentions(&e, &["`a/b` cannot name an output", "outputs/<name>/"]);
}

#[test]
fn an_argument_bound_to_an_input_without_a_value_is_refused() {
    // `n: ~` (or `n:` with nothing after it) is a literal with no value; it used to be passed
    // to the script as the text `null`.
    let yaml = with_args("--n ${{inputs.n}}").replace("input_data:", "  n: ~\ninput_data:");
    let e = err(&yaml);
    assert_mentions(&e, &["`${{inputs.n}}` has no value", "give the input a value"]);
}

#[test]
fn batchfleet_flags_take_no_data_bindings() {
    let e = err(&with_args("--error_threshold ${{inputs.data}}"));
    assert_mentions(&e, &["`--error_threshold` takes a value, not a data input or output"]);
}

fn with_args(args: &str) -> String {
    BASE.replace(
        "entry_script: score.py",
        &format!("entry_script: score.py\n  program_arguments: {args}"),
    )
}

#[test]
fn program_arguments_take_both_flag_forms_and_pass_the_rest_in_order() {
    let job = ok(&with_args(
        "--model m1 --error_threshold=7 -v --task_overhead_timeout 12 'two words' --copy_logs_to_parent=False --x=1 last",
    ))
    .job;
    let args = job.task.program_args;
    assert_eq!(args.error_threshold, 7);
    assert_eq!(args.task_overhead_timeout_secs, 12);
    assert!(!args.copy_logs_to_parent);
    assert_eq!(args.allowed_failed_percent, 100.0);
    assert_eq!(job.task.script_args, ["--model", "m1", "-v", "two words", "--x=1", "last"]);
}

#[test]
fn misspelt_flags_warn_and_pass_through() {
    let parsed = ok(&with_args("--resource_monitor_interva 30 --batch 4"));
    assert_eq!(parsed.job.task.script_args, ["--resource_monitor_interva", "30", "--batch", "4"]);
    assert_eq!(parsed.job.task.program_args.resource_monitor_interval_secs, 600);
    assert_eq!(parsed.warnings.len(), 1, "{:?}", parsed.warnings);
    let warning = &parsed.warnings[0];
    assert_eq!((warning.line, warning.column), (11, 22));
    assert_eq!(
        warning.to_string(),
        "/jobs/job.yaml:11:22: warning: `--resource_monitor_interva` looks like a misspelling of \
         `--resource_monitor_interval`; it is passed to the entry script unchanged"
    );
}

#[test]
fn warnings_inside_folded_arguments_point_at_the_flag() {
    let parsed = ok(&with_args(">-\n    --a 1\n    --error_treshold 2"));
    assert_eq!(parsed.job.task.script_args, ["--a", "1", "--error_treshold", "2"]);
    assert_eq!((parsed.warnings[0].line, parsed.warnings[0].column), (13, 5));
    assert_mentions(&parsed.warnings[0], &["misspelling of `--error_threshold`"]);
}

#[test]
fn superseded_azure_flags_warn_where_to_set_them() {
    let parsed = ok(&with_args("--run_invocation_timeout 600"));
    assert_mentions(&parsed.warnings[0], &["`--run_invocation_timeout`", "retry_settings.timeout"]);
    assert_eq!(parsed.job.task.script_args, ["--run_invocation_timeout", "600"]);
}

#[test]
fn bad_flag_values_name_the_flag_value_and_range() {
    let e = err(&with_args("--a b --task_overhead_timeout 0"));
    assert_at(&e, 11, 52, "task.program_arguments");
    assert_mentions(
        &e,
        &["`--task_overhead_timeout`: 0 is out of range; allowed: 1 or more seconds"],
    );

    let e = err(&with_args("\"--allowed_failed_percent=150\""));
    assert_mentions(&e, &["`--allowed_failed_percent`: 150 is out of range; allowed: 0 to 100"]);

    let e = err(&with_args("--copy_logs_to_parent yes"));
    assert_mentions(&e, &["`--copy_logs_to_parent`: expected True or False, found `yes`"]);

    let e = err(&with_args("--error_threshold"));
    assert_mentions(&e, &["`--error_threshold` needs a value"]);

    let e = err(&with_args("--first_task_creation_timeout soon"));
    assert_mentions(&e, &["expected an integer, found `soon`; allowed: 1 or more seconds"]);

    let e = err(&with_args("--a 'unclosed"));
    assert_at(&e, 11, 26, "task.program_arguments");
    assert_mentions(&e, &["never closed"]);
}

#[test]
fn error_threshold_given_twice_must_agree() {
    let both = with_args("--error_threshold 5") + "error_threshold: 3\n";
    let e = err(&both);
    assert_mentions(&e, &["`--error_threshold 5` disagrees with `error_threshold: 3` at line 12"]);

    let same = with_args("--error_threshold 3") + "error_threshold: 3\n";
    assert_eq!(ok(&same).job.task.program_args.error_threshold, 3);
    let top = with("error_threshold: 4\n");
    assert_eq!(ok(&top).job.task.program_args.error_threshold, 4);
}

// ---- pipelines --------------------------------------------------------------------------------

#[test]
fn pipeline_runs_its_parallel_step_with_parent_bindings() {
    let parsed =
        spec::load_job_file(&fixture("pipeline.yaml"), &spec::Datastores::default()).unwrap();
    let job = parsed.job;
    assert_eq!(job.name, "pipeline");
    assert_eq!(job.display_name.as_deref(), Some("Score the iris files"));
    assert_eq!(job.description.as_deref(), Some("A pipeline with one parallel step."));
    assert_eq!(job.experiment_name.as_deref(), Some("pipelines"));
    assert_eq!(job.tags.get("owner").map(String::as_str), Some("data-team"));
    assert_eq!(job.tags.get("step").map(String::as_str), Some("score"));
    assert_eq!(job.compute.as_deref(), Some("azureml:cpu-cluster"));

    assert_eq!(job.input.name, "job_data_path");
    assert_eq!(job.input.url, fixture_url("data/iris"));
    assert_eq!(job.input.mode, InputMode::Download);
    assert_eq!(job.inputs["model"], InputValue::Literal(json!("iris-model")));
    assert_eq!(job.outputs["job_output_path"].url.as_deref(), Some("s3://bucket/iris/predictions"));
    assert_eq!(job.task.append_row_to.as_deref(), Some("s3://bucket/iris/predictions"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/src");
    assert_eq!(job.task.code, url::Url::from_file_path(src).unwrap().to_string());
    assert_eq!(job.task.script_args, ["--model", "iris-model"]);
    assert_eq!(job.task.program_args.error_threshold, 3);
    assert_eq!(job.mini_batch_size, MiniBatchSize::Count(2));
    assert_eq!((job.retry.max_retries, job.retry.timeout_secs), (1, 30));

    assert_eq!(parsed.warnings.len(), 1);
    assert_mentions(&parsed.warnings[0], &["step `prepare` (`type: command`) is skipped"]);
    assert_eq!(parsed.warnings[0].line, 27);
}

const PIPELINE: &str = "\
type: pipeline
inputs:
  raw:
    path: ./raw
jobs:
  score:
    type: parallel
    inputs:
      data: ${{parent.inputs.raw}}
    input_data: ${{inputs.data}}
    task:
      type: run_function
      code: ./src
      entry_script: score.py
";

#[test]
fn pipeline_step_errors_carry_the_step_path() {
    let job = ok(PIPELINE).job;
    assert_eq!(job.input.url, "file:///jobs/raw");
    assert_eq!(job.input.name, "data");

    let e = err(&PIPELINE.replace("parent.inputs.raw", "parent.inputs.rw"));
    assert_at(&e, 9, 13, "jobs.score.inputs.data");
    assert_mentions(
        &e,
        &["`${{parent.inputs.rw}}` names no input of the pipeline", "did you mean `raw`?"],
    );

    let e = err(&format!("{PIPELINE}    retry_settings:\n      timeout: 0\n"));
    assert_at(&e, 16, 16, "jobs.score.retry_settings.timeout");
}

#[test]
fn step_arguments_bind_the_steps_own_data() {
    let args = |a: &str| {
        PIPELINE.replace(
            "entry_script: score.py",
            &format!("entry_script: score.py\n      program_arguments: --d {a}"),
        )
    };
    let job = ok(&args("${{inputs.data}}")).job;
    assert_eq!(job.task.script_args[1], ScriptArg::Template(vec![ArgPiece::Input("data".into())]));
    let e = err(&args("${{parent.inputs.raw}}"));
    assert_mentions(&e, &["binds the pipeline's data directly", "declare it as an input"]);
}

#[test]
fn pipeline_with_two_parallel_steps_is_refused() {
    let second = PIPELINE.lines().skip(5).map(|l| format!("{l}\n")).collect::<String>().replacen(
        "score:",
        "score_again:",
        1,
    );
    let e = err(&format!("{PIPELINE}{second}"));
    assert_at(&e, 15, 3, "jobs.score_again");
    assert_mentions(&e, &["several steps are `type: parallel` (`score`, `score_again`)"]);
}

#[test]
fn pipeline_without_a_parallel_step_is_refused() {
    let e = err("type: pipeline\njobs:\n  a:\n    type: command\n  b:\n    type: sweep\n");
    assert_at(&e, 2, 1, "jobs");
    assert_mentions(&e, &["no step has `type: parallel` (steps: `a`, `b`)"]);
}

#[test]
fn parent_bindings_outside_a_pipeline_are_refused() {
    let e = err(&BASE.replace("${{inputs.data}}", "${{parent.inputs.data}}"));
    assert_at(&e, 6, 13, "input_data");
    assert_mentions(&e, &["not a step of a pipeline"]);
}
