//! What a batch's runtime reads: its items as local paths (`materialize`: downloads, the
//! input folder's own paths or copies), tabular pieces as local files (`table_input`), and the
//! data inputs bound in `program_arguments` (`mounts`).

pub(crate) mod materialize;
pub(crate) mod mounts;
pub(crate) mod table_input;
