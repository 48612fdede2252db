use super::transformations::{ENCODINGS, HEADERS};
use super::*;
use crate::table::pattern::PathPattern;
use crate::table::{ColumnStep, HeaderMode, InvalidLines, RowStep, TextEncoding};

const AT: &str = "file:///data/t/MLTable";

fn url(s: &str) -> Url {
    Url::parse(s).unwrap()
}

fn parse(text: &str) -> MlTable {
    parse_mltable(text, &url(AT)).unwrap_or_else(|e| panic!("{e}"))
}

fn parse_at(text: &str, at: &str) -> MlTable {
    parse_mltable(text, &url(at)).unwrap_or_else(|e| panic!("{e}"))
}

fn error(text: &str) -> SpecError {
    match parse_mltable(text, &url(AT)) {
        Ok(table) => panic!("parsed: {table:?}"),
        Err(e) => e,
    }
}

/// An error's key, line and column, and that its message holds every one of `parts`.
fn check(err: &SpecError, key: Option<&str>, line: usize, column: usize, parts: &[&str]) {
    assert_eq!(err.file, AT, "{err}");
    assert_eq!(err.key.as_deref(), key, "{err}");
    assert_eq!((err.line, err.column), (Some(line), Some(column)), "{err}");
    for part in parts {
        assert!(err.message.contains(part), "{part:?} not in: {err}");
    }
}

fn delimited(header: HeaderMode) -> TableFormat {
    TableFormat::Delimited {
        delimiter: ",".into(),
        encoding: TextEncoding::Utf8,
        header,
        empty_as_string: false,
        support_multi_line: false,
        infer_column_types: true,
    }
}

#[test]
fn a_full_delimited_table() {
    let table = parse(
        "$schema: https://azuremlschemas.azureedge.net/latest/MLTable.schema.json\n\
         type: mltable\n\
         paths:\n\
         \x20 - pattern: ./sales/**/*.csv\n\
         transformations:\n\
         \x20 - read_delimited:\n\
         \x20     delimiter: ';'\n\
         \x20     encoding: latin1\n\
         \x20     header: all_files_different_headers\n\
         \x20     empty_as_string: true\n\
         \x20     include_path_column: true\n\
         \x20     support_multi_line: false\n\
         \x20     infer_column_types: true\n\
         \x20 - extract_columns_from_partition_format: '{Store}/{Brand}/{file}.csv'\n\
         \x20 - keep_columns: [Store, Brand, amount]\n\
         \x20 - drop_columns: Brand\n\
         \x20 - skip: 10\n\
         \x20 - take: 5\n",
    );
    assert_eq!(table.file, AT);
    assert_eq!(table.paths, [MlPath::Pattern("file:///data/t/sales/**/*.csv".into())]);
    assert_eq!(
        table.read,
        TableRead {
            format: TableFormat::Delimited {
                delimiter: ";".into(),
                encoding: TextEncoding::Latin1,
                header: HeaderMode::AllFilesDifferentHeaders,
                empty_as_string: true,
                support_multi_line: false,
                infer_column_types: true,
            },
            include_path_column: true,
            partition_format: Some("{Store}/{Brand}/{file}.csv".into()),
            column_steps: vec![
                ColumnStep::Keep(vec!["Store".into(), "Brand".into(), "amount".into()]),
                ColumnStep::Drop(vec!["Brand".into()]),
            ],
            row_steps: vec![RowStep::Skip(10), RowStep::Take(5)],
        }
    );
}

#[test]
fn read_options_have_azure_defaults() {
    for text in [
        "paths: [{file: a.csv}]\ntransformations:\n  - read_delimited:\n",
        "paths: [{file: a.csv}]\ntransformations:\n  - read_delimited: {}\n",
        "paths: [{file: a.csv}]\ntransformations:\n  - read_delimited\n",
    ] {
        let table = parse(text);
        assert_eq!(table.read.format, delimited(HeaderMode::AllFilesSameHeaders), "{text}");
        assert!(!table.read.include_path_column);
    }
    let table = parse("paths: [{file: a.jsonl}]\ntransformations: [read_json_lines]\n");
    assert_eq!(
        table.read.format,
        TableFormat::JsonLines { encoding: TextEncoding::Utf8, invalid_lines: InvalidLines::Error }
    );
    let table = parse("paths: [{file: a.parquet}]\ntransformations:\n  - read_parquet:\n");
    assert_eq!(table.read.format, TableFormat::Parquet);
    assert!(!table.read.include_path_column);
}

#[test]
fn json_lines_and_parquet_options() {
    let table = parse(
        "paths:\n  - folder: ./logs\ntransformations:\n  - read_json_lines:\n      \
         encoding: UTF8BOM\n      invalid_lines: drop\n      include_path_column: true\n",
    );
    assert_eq!(
        table.read.format,
        TableFormat::JsonLines {
            encoding: TextEncoding::Utf8bom,
            invalid_lines: InvalidLines::Drop
        }
    );
    assert!(table.read.include_path_column);
    let table = parse(
        "paths:\n  - folder: ./p\ntransformations:\n  - read_parquet:\n      \
         include_path_column: True\n  - take: 0\n",
    );
    assert_eq!(table.read.format, TableFormat::Parquet);
    assert!(table.read.include_path_column);
    assert_eq!(table.read.row_steps, [RowStep::Take(0)]);
}

#[test]
fn every_encoding_and_header_mode_reads() {
    for (name, encoding) in ENCODINGS {
        assert!(TextEncoding::ALLOWED.contains(name), "{name}");
        let table = parse(&format!(
            "paths: [{{file: a.csv}}]\ntransformations:\n  - read_delimited: {{encoding: \
             {name}}}\n"
        ));
        let TableFormat::Delimited { encoding: got, .. } = table.read.format else { panic!() };
        assert_eq!(got, *encoding);
    }
    for (name, header) in HEADERS {
        let table = parse(&format!(
            "paths: [{{file: a.csv}}]\ntransformations:\n  - read_delimited: {{header: \
             {name}}}\n"
        ));
        assert_eq!(table.read.format, delimited(*header));
    }
    let table = parse(
        "paths: [{file: a.tsv}]\ntransformations:\n  - read_delimited: {delimiter: \"\\t\", \
         support_multi_line: true}\n",
    );
    let TableFormat::Delimited { delimiter, support_multi_line, .. } = table.read.format else {
        panic!()
    };
    assert_eq!((delimiter.as_str(), support_multi_line), ("\t", true));
}

#[test]
fn paths_resolve_against_the_mltable_folder() {
    let table = parse(
        "paths:\n\
         \x20 - folder: ./data\n\
         \x20 - file: data/x.csv\n\
         \x20 - folder: ../x\n\
         \x20 - folder: .\n\
         \x20 - folder: sub/\n\
         \x20 - file: /abs/y.csv\n\
         \x20 - folder: /abs/dir\n\
         \x20 - file: s3://bucket/k/z.csv\n\
         \x20 - folder: s3://bucket/k\n\
         \x20 - folder: gs://b\n\
         \x20 - folder: az://container/p/\n\
         \x20 - file: file:///other/f.csv\n\
         \x20 - file: my data/a#1?.csv\n\
         \x20 - file: 100%.csv\n\
         \x20 - file: 'c:d.csv'\n\
         \x20 - pattern: '*.csv'\n\
         \x20 - pattern: ../in/**/part-?.csv\n\
         \x20 - pattern: s3://bucket/x/[ab]*.csv\n\
         \x20 - pattern: /abs/*/f.csv\n",
    );
    let expected = [
        MlPath::Folder("file:///data/t/data/".into()),
        MlPath::File("file:///data/t/data/x.csv".into()),
        MlPath::Folder("file:///data/x/".into()),
        MlPath::Folder("file:///data/t/".into()),
        MlPath::Folder("file:///data/t/sub/".into()),
        MlPath::File("file:///abs/y.csv".into()),
        MlPath::Folder("file:///abs/dir/".into()),
        MlPath::File("s3://bucket/k/z.csv".into()),
        MlPath::Folder("s3://bucket/k/".into()),
        MlPath::Folder("gs://b/".into()),
        MlPath::Folder("az://container/p/".into()),
        MlPath::File("file:///other/f.csv".into()),
        MlPath::File("file:///data/t/my%20data/a%231%3F.csv".into()),
        MlPath::File("file:///data/t/100%25.csv".into()),
        MlPath::File("file:///data/t/c:d.csv".into()),
        MlPath::Pattern("file:///data/t/*.csv".into()),
        MlPath::Pattern("file:///data/in/**/part-?.csv".into()),
        MlPath::Pattern("s3://bucket/x/[ab]*.csv".into()),
        MlPath::Pattern("file:///abs/*/f.csv".into()),
    ];
    assert_eq!(table.paths, expected);
    assert_eq!(table.read.format, TableFormat::FileList);
    for path in &table.paths {
        if let MlPath::Pattern(p) = path {
            PathPattern::parse(p).unwrap();
        }
    }
}

#[test]
fn paths_resolve_against_an_mltable_in_a_bucket() {
    let table = parse_at(
        "paths:\n  - folder: ./data\n  - file: ../raw/x.csv\n  - pattern: d/*.jsonl\n  - \
         file: /local/y.csv\n",
        "s3://bkt/tables/t1/MLTable",
    );
    assert_eq!(
        table.paths,
        [
            MlPath::Folder("s3://bkt/tables/t1/data/".into()),
            MlPath::File("s3://bkt/tables/raw/x.csv".into()),
            MlPath::Pattern("s3://bkt/tables/t1/d/*.jsonl".into()),
            MlPath::File("file:///local/y.csv".into()),
        ]
    );
    assert_eq!(table.file, "s3://bkt/tables/t1/MLTable");
}

#[test]
fn glob_characters_in_the_mltable_folder_are_not_globs() {
    let table = parse_at("paths:\n  - pattern: '*.csv'\n", "file:///data/[x]*/MLTable");
    assert_eq!(table.paths, [MlPath::Pattern("file:///data/%5Bx]%2A/*.csv".into())]);
    let MlPath::Pattern(p) = &table.paths[0] else { panic!() };
    assert_eq!(PathPattern::parse(p).unwrap().base, "file:///data/%5Bx]%2A/");
}

#[test]
fn a_file_list_may_take_and_skip_files() {
    let table = parse(
        "paths: [{folder: ./in}]\ntransformations:\n  - extract_columns_from_partition_format: \
         {partition_format: '{Year}/{f}.csv'}\n  - take: 3\n",
    );
    assert_eq!(table.read.format, TableFormat::FileList);
    assert_eq!(table.read.partition_format.as_deref(), Some("{Year}/{f}.csv"));
    assert_eq!(table.read.row_steps, [RowStep::Take(3)]);
}

#[test]
fn traits_and_schema_are_ignored() {
    let table = parse(
        "$schema: x\ntype: MLTable\ntraits:\n  timestamp_column: ts\n  index_columns: [id]\n\
         paths: [{file: a.csv}]\n",
    );
    assert_eq!(table.paths.len(), 1);
}

#[test]
fn unknown_keys_suggest_the_meant_one() {
    let err = error("path:\n  - file: a.csv\n");
    check(&err, Some("path"), 1, 1, &["unknown key `path`", "did you mean `paths`?"]);
    let err = error(
        "paths: [{file: a.csv}]\ntransformations:\n  - read_delimited:\n      heder: no_header\n",
    );
    check(
        &err,
        Some("transformations[0].read_delimited.heder"),
        4,
        7,
        &["unknown key `heder`", "did you mean `header`?"],
    );
    let err = error(
        "paths: [{file: a.csv}]\ntransformations:\n  - read_parquet:\n      delimiter: ','\n",
    );
    check(
        &err,
        Some("transformations[0].read_parquet.delimiter"),
        4,
        7,
        &["unknown key `delimiter`", "`include_path_column`"],
    );
}

#[test]
fn bad_option_values_say_what_is_allowed() {
    let base = "paths: [{file: a.csv}]\ntransformations:\n  - read_delimited:\n";
    let err = error(&format!("{base}      header: first_line\n"));
    check(
        &err,
        Some("transformations[0].read_delimited.header"),
        4,
        15,
        &["`first_line` is not allowed", "`no_header`", "`all_files_different_headers`"],
    );
    let err = error(&format!("{base}      encoding: utf-8\n"));
    check(
        &err,
        Some("transformations[0].read_delimited.encoding"),
        4,
        17,
        &["`utf-8` is not allowed", "did you mean `utf8`?"],
    );
    let err = error(&format!("{base}      encoding: utf32\n"));
    check(
        &err,
        Some("transformations[0].read_delimited.encoding"),
        4,
        17,
        &["not supported", TextEncoding::ALLOWED],
    );
    let err = error(&format!("{base}      empty_as_string: yes\n"));
    check(
        &err,
        Some("transformations[0].read_delimited.empty_as_string"),
        4,
        24,
        &["expected `true` or `false`, found `yes`"],
    );
    let err = error(&format!("{base}      delimiter: ''\n"));
    check(&err, Some("transformations[0].read_delimited.delimiter"), 4, 18, &["empty"]);
    let err = error(
        "paths: [{file: a.jsonl}]\ntransformations:\n  - read_json_lines: {invalid_lines: \
         skip}\n",
    );
    check(
        &err,
        Some("transformations[0].read_json_lines.invalid_lines"),
        3,
        38,
        &["`skip` is not allowed", "`error`, `drop`"],
    );
    let err = error("paths: [{file: a.csv}]\ntransformations:\n  - read_delimited: 5\n");
    check(&err, Some("transformations[0].read_delimited"), 3, 21, &["expected a mapping"]);
}

#[test]
fn unsupported_transformations_are_named_never_ignored() {
    for name in ["filter", "convert_column_types", "take_random_sample", "read_delta_lake"] {
        let err = error(&format!(
            "paths: [{{file: a.csv}}]\ntransformations:\n  - read_delimited:\n  - {name}: x\n"
        ));
        check(
            &err,
            Some(&format!("transformations[1].{name}")),
            4,
            5,
            &[
                &format!("`{name}` transformation is not supported"),
                "`read_delimited`, `read_json_lines`, `read_parquet`",
                "`take`, `skip`",
            ],
        );
    }
    let err = error("paths: [{file: a.jsonl}]\ntransformations:\n  - read_jsonlines:\n");
    check(
        &err,
        Some("transformations[0].read_jsonlines"),
        3,
        5,
        &["unknown transformation `read_jsonlines`", "did you mean `read_json_lines`?"],
    );
    let err = error("paths: [{file: a.csv}]\ntransformations:\n  - frobnicate\n");
    check(&err, Some("transformations[0]"), 3, 5, &["unknown transformation `frobnicate`"]);
}

#[test]
fn one_read_transformation_and_it_comes_first() {
    let err =
        error("paths: [{file: a.csv}]\ntransformations:\n  - read_delimited:\n  - read_parquet:\n");
    check(
        &err,
        Some("transformations[1].read_parquet"),
        4,
        5,
        &["a second read transformation", "after `read_delimited` (transformations[0])"],
    );
    let err = error("paths: [{file: a.csv}]\ntransformations:\n  - take: 5\n  - read_parquet\n");
    check(
        &err,
        Some("transformations[1]"),
        4,
        5,
        &["`read_parquet` must be the first transformation", "`take` (transformations[0])"],
    );
    let err = error("paths: [{file: a.csv}]\ntransformations:\n  - keep_columns: [a]\n");
    check(
        &err,
        Some("transformations[0].keep_columns"),
        3,
        5,
        &["needs a read transformation", "list of files"],
    );
}

#[test]
fn row_and_column_steps_are_checked() {
    let base = "paths: [{file: a.csv}]\ntransformations:\n  - read_parquet\n";
    let err = error(&format!("{base}  - take: -1\n"));
    check(&err, Some("transformations[1].take"), 4, 11, &["-1 is out of range", "0 or more"]);
    let err = error(&format!("{base}  - skip: many\n"));
    check(&err, Some("transformations[1].skip"), 4, 11, &["expected an integer"]);
    let err = error(&format!("{base}  - take:\n"));
    check(&err, Some("transformations[1].take"), 4, 5, &["expected an integer"]);
    let err = error(&format!("{base}  - take\n"));
    check(&err, Some("transformations[1]"), 4, 5, &["needs a value"]);
    let err = error(&format!("{base}  - keep_columns: []\n"));
    check(&err, Some("transformations[1].keep_columns"), 4, 19, &["empty"]);
    let err = error(&format!("{base}  - drop_columns: [a, {{b: c}}]\n"));
    check(&err, Some("transformations[1].drop_columns[1]"), 4, 23, &["expected text"]);
    let err = error(&format!("{base}  - take: 1\n    skip: 2\n"));
    check(&err, Some("transformations[1].skip"), 5, 5, &["`skip` is a second key", "- skip:"]);
}

#[test]
fn partition_formats_are_validated_where_written() {
    let base = "paths: [{folder: in}]\ntransformations:\n  - read_parquet\n";
    let err = error(&format!(
        "{base}  - extract_columns_from_partition_format: '{{d:yyyy/MM/dd}}/{{f}}.parquet'\n"
    ));
    check(
        &err,
        Some("transformations[1].extract_columns_from_partition_format"),
        4,
        44,
        &["datetime formats are not supported"],
    );
    let err = error(&format!(
        "{base}  - extract_columns_from_partition_format:\n      partition_format: '{{a}}/{{a}}'\n"
    ));
    check(
        &err,
        Some("transformations[1].extract_columns_from_partition_format.partition_format"),
        5,
        25,
        &["appears twice"],
    );
    let err = error(&format!("{base}  - extract_columns_from_partition_format: {{Store}}\n"));
    check(
        &err,
        Some("transformations[1].extract_columns_from_partition_format"),
        4,
        44,
        &["put the format in quotes"],
    );
    let err = error(&format!(
        "{base}  - extract_columns_from_partition_format: '{{a}}.x'\n  - \
         extract_columns_from_partition_format: '{{b}}.x'\n"
    ));
    check(
        &err,
        Some("transformations[2].extract_columns_from_partition_format"),
        5,
        5,
        &["a second"],
    );
}

#[test]
fn bad_paths_say_why() {
    let err = error("paths:\n  - file: azureml://datastores/ws/paths/a.csv\n");
    check(&err, Some("paths[0].file"), 2, 11, &["azureml:// URIs", "not supported", "az://"]);
    let err = error("paths:\n  - file: https://acct.blob.core.windows.net/c/a.csv\n");
    check(&err, Some("paths[0].file"), 2, 11, &["`https` is not supported", "az://"]);
    let err = error("paths:\n  - files: a.csv\n");
    check(
        &err,
        Some("paths[0].files"),
        2,
        5,
        &["unknown kind of path `files`", "did you mean `file`?"],
    );
    let err = error("paths:\n  - file: a.csv\n    folder: b\n");
    check(&err, Some("paths[0].folder"), 3, 5, &["`folder` is a second key"]);
    let err = error("paths:\n  - ./data\n");
    check(&err, Some("paths[0]"), 2, 5, &["expected a mapping with one key", "`./data`"]);
    let err = error("paths:\n  - file: data/\n");
    check(&err, Some("paths[0].file"), 2, 11, &["use `folder:`"]);
    let err = error("paths:\n  - file: .\n");
    check(&err, Some("paths[0].file"), 2, 11, &["is the folder"]);
    let err = error("paths: []\n");
    check(&err, Some("paths"), 1, 8, &["at least one"]);
    let err = error("paths: ./data\n");
    check(&err, Some("paths"), 1, 8, &["expected a list"]);
    let err = error("type: mltable\n");
    check(&err, Some("paths"), 1, 1, &["is required"]);
    let err = error("paths:\n  - pattern: s3://b/x/[ab.csv\n");
    check(&err, Some("paths[0].pattern"), 2, 14, &["never closed"]);
    let err = error("paths:\n  - pattern: data/\n");
    check(&err, Some("paths[0].pattern"), 2, 14, &["names a folder"]);
    let err = error("paths:\n  - file: s3://b/a.csv?versionId=3\n");
    check(&err, Some("paths[0].file"), 2, 11, &["`?` or `#`"]);
    let err = error("paths:\n  - file: ''\n");
    check(&err, Some("paths[0].file"), 2, 11, &["empty"]);
}

#[test]
fn document_errors() {
    let err = parse_mltable("# nothing\n", &url(AT)).unwrap_err();
    assert_eq!((err.file.as_str(), err.line), (AT, None));
    assert!(err.message.contains("empty"), "{err}");
    let err = error("paths: [\n");
    assert_eq!(err.file, AT);
    assert!(err.message.contains("not valid YAML"), "{err}");
    let err = error("- a\n- b\n");
    check(&err, None, 1, 1, &["expected a mapping"]);
    let err = error("type: table\npaths: [{file: a}]\n");
    check(&err, Some("type"), 1, 7, &["`table` is not allowed", "`mltable`"]);
    let err = error("traits: {time_column: t}\npaths: [{file: a}]\n");
    check(&err, Some("traits.time_column"), 1, 10, &["unknown key"]);
}

#[test]
fn errors_print_where_they_are() {
    let err =
        error("paths: [{file: a.csv}]\ntransformations:\n  - read_delimited:\n      header: x\n");
    assert!(
        err.to_string().starts_with(
            "file:///data/t/MLTable:4:15: transformations[0].read_delimited.header: `x` is \
             not allowed; allowed: "
        ),
        "{err}"
    );
}
