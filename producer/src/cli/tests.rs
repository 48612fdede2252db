use clap::CommandFactory;

use super::Cli;

/// Every option and argument of every subcommand says what it is in `--help`.
#[test]
fn every_option_has_a_help_text() {
    let cli = Cli::command();
    let mut missing = Vec::new();
    for command in cli.get_subcommands() {
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            let empty =
                arg.get_help().map(|help| help.to_string().trim().is_empty()).unwrap_or(true);
            if empty {
                missing.push(format!(
                    "batchfleet {} --{}",
                    command.get_name(),
                    id.replace('_', "-")
                ));
            }
        }
    }
    assert!(missing.is_empty(), "options without a help text: {missing:?}");
}

/// Every subcommand lists its exit codes under `--help`.
#[test]
fn every_subcommand_lists_its_exit_codes() {
    let cli = Cli::command();
    let mut missing = Vec::new();
    for command in cli.get_subcommands() {
        let after = command.get_after_help().map(|text| text.to_string()).unwrap_or_default();
        if !(after.contains("Exit codes:") && after.contains("  0  ") && after.contains("  2  ")) {
            missing.push(command.get_name().to_string());
        }
    }
    assert!(missing.is_empty(), "subcommands whose --help lacks exit codes: {missing:?}");
}
