//! "Did you mean …?": the closest known name to a misspelt one.

/// The candidate `word` most likely misspells, if any is close enough to be a good guess.
///
/// Close means few edits (transpositions count as one) relative to the name's length, or a
/// high Jaro-Winkler similarity, which forgives a dropped tail (`--resource_monitor_interva`).
/// Case is ignored, so `Mini_Batch_Size` finds `mini_batch_size`.
pub(crate) fn did_you_mean<'c>(word: &str, candidates: &[&'c str]) -> Option<&'c str> {
    let word = normalize(word);
    candidates
        .iter()
        .map(|c| (*c, score(&word, &normalize(c))))
        .filter(|(_, s)| s.is_close())
        .min_by(|a, b| a.1.cmp(&b.1))
        .map(|(c, _)| c)
}

fn normalize(name: &str) -> String {
    name.trim_start_matches('-').to_ascii_lowercase()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Score {
    edits: usize,
    /// Jaro-Winkler similarity scaled to 0..=1000, negated so smaller is better like `edits`.
    dissimilarity: u32,
    max_edits: usize,
}

impl Score {
    fn is_close(&self) -> bool {
        self.edits <= self.max_edits || self.dissimilarity <= 100
    }
}

fn score(word: &str, candidate: &str) -> Score {
    let edits = strsim::osa_distance(word, candidate);
    let similarity = strsim::jaro_winkler(word, candidate);
    let dissimilarity = ((1.0 - similarity) * 1000.0).round() as u32;
    // Short names need tighter limits: `name` is two edits from `type`.
    let max_edits = (candidate.chars().count() / 4).clamp(1, 3);
    Score { edits, dissimilarity, max_edits }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: &[&str] =
        &["type", "name", "mini_batch_size", "max_concurrency_per_instance", "task"];

    #[test]
    fn close_names_are_suggested() {
        assert_eq!(did_you_mean("mini_batch_sise", KEYS), Some("mini_batch_size"));
        assert_eq!(did_you_mean("minibatch_size", KEYS), Some("mini_batch_size"));
        assert_eq!(did_you_mean("tpye", KEYS), Some("type"));
        assert_eq!(did_you_mean("Mini_Batch_Size", KEYS), Some("mini_batch_size"));
        assert_eq!(did_you_mean("max_concurrency", KEYS), Some("max_concurrency_per_instance"));
    }

    #[test]
    fn unrelated_names_are_not() {
        assert_eq!(did_you_mean("environment", KEYS), None);
        assert_eq!(did_you_mean("foo", KEYS), None);
        assert_eq!(
            did_you_mean("--model_path", &["--error_threshold", "--task_overhead_timeout"]),
            None
        );
    }
}
