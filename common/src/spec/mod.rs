//! Parsing and validating the job spec YAML.
