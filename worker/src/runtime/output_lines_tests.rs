//! Counting a runtime's output lines.

use super::lines_of;

#[tokio::test]
async fn the_drivers_line_count_stands_for_a_file_of_the_size_it_wrote_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("out.txt");
    std::fs::write(&file, "a\nb\nc\n").unwrap();
    // The size matches: the file is not read, so the (deliberately different) count stands.
    assert_eq!(lines_of(&file, Some((2, 6))).await.unwrap(), 2);
    // Another size: the file changed after the driver wrote it, and is counted.
    assert_eq!(lines_of(&file, Some((2, 5))).await.unwrap(), 3);
    // Nothing reported (a DataFrame's rows): counted.
    assert_eq!(lines_of(&file, None).await.unwrap(), 3);
    // No file: no lines.
    assert_eq!(lines_of(&dir.path().join("none.txt"), Some((0, 0))).await.unwrap(), 0);
}
