use std::path::Path;

use super::{can_view, refuses_for_good, sees};

#[test]
fn a_folder_is_viewed_when_nothing_written_lies_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let (data, jobs) = (dir.path().join("data"), dir.path().join("jobs"));
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&jobs).unwrap();
    assert!(can_view(&data, &[&jobs, Path::new("/tmp")]));
    // A sibling whose name starts with the folder's is not in it.
    assert!(can_view(&data, &[&dir.path().join("data-out")]));
}

#[test]
fn a_folder_holding_a_written_folder_is_not_viewed() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("jobs")).unwrap();
    assert!(!can_view(&data, &[&data.join("jobs")]), "an existing folder in it");
    assert!(!can_view(&data, &[&data.join("out/not/yet/made")]), "one not made yet");
    assert!(!can_view(&data, &[&data]), "the folder itself");
    assert!(!can_view(Path::new("/"), &[]), "the root folder holds everything");
}

#[test]
fn links_are_followed_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let (data, elsewhere) = (dir.path().join("data"), dir.path().join("elsewhere"));
    std::fs::create_dir_all(data.join("jobs")).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    // A written folder reached through a link that points into the input folder.
    std::os::unix::fs::symlink(data.join("jobs"), elsewhere.join("jobs")).unwrap();
    assert!(!can_view(&data, &[&elsewhere.join("jobs")]));
    // The input folder named through a link.
    std::os::unix::fs::symlink(&data, dir.path().join("data-link")).unwrap();
    assert!(!can_view(&dir.path().join("data-link"), &[&data.join("jobs")]));
    assert!(can_view(&dir.path().join("data-link"), &[&elsewhere]));
}

#[test]
fn a_file_is_seen_through_the_view_only_where_it_resolves_into_the_folder() {
    let dir = tempfile::tempdir().unwrap();
    let (data, elsewhere) = (dir.path().join("data"), dir.path().join("elsewhere"));
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(data.join("in.csv"), "x").unwrap();
    std::fs::write(elsewhere.join("out.csv"), "x").unwrap();
    std::os::unix::fs::symlink(elsewhere.join("out.csv"), data.join("link.csv")).unwrap();
    assert!(sees(&data, &data.join("in.csv")));
    assert!(!sees(&data, &elsewhere.join("out.csv")), "a file outside the folder");
    assert!(!sees(&data, &data.join("link.csv")), "a link in it that leads out");
    assert!(!sees(&data, &dir.path().join("data-2/in.csv")), "a sibling sharing its name");
    // Below the folder: a link to a folder outside, a link back inside, `..`, a folder given
    // through a link of its own.
    std::fs::create_dir_all(data.join("a/b")).unwrap();
    std::fs::write(data.join("a/b/deep.csv"), "x").unwrap();
    std::os::unix::fs::symlink(&elsewhere, data.join("a/out")).unwrap();
    std::os::unix::fs::symlink(data.join("a/b"), data.join("a/in")).unwrap();
    assert!(sees(&data, &data.join("a/b/deep.csv")));
    assert!(!sees(&data, &data.join("a/out/out.csv")), "a folder link that leads out");
    assert!(sees(&data, &data.join("a/in/deep.csv")), "a folder link that stays inside");
    assert!(!sees(&data, &data.join("a/../../elsewhere/out.csv")), "`..` out of the folder");
    assert!(sees(&data, &data.join("a/../in.csv")), "`..` that stays inside");
    std::os::unix::fs::symlink(&data, dir.path().join("data-link")).unwrap();
    let through = dir.path().join("data-link");
    assert!(sees(&through, &through.join("a/b/deep.csv")), "the folder given through a link");
    assert!(sees(&through, &data.join("in.csv")), "the folder's own path, given through a link");
    assert!(!sees(&through, &through.join("link.csv")), "a link in it that leads out");
    assert!(sees(&data, &data.join("missing/in.csv")), "a place not made yet lands inside");
}

/// The user-namespace path, which a worker that is not root takes: a root test process runs
/// the child as `nobody`, another as itself.
#[test]
fn a_user_that_is_not_root_sees_the_folder_read_only_with_its_own_ids() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("a.txt"), "kept").unwrap();
    // Open to everyone: only the view stands in the way of the writes.
    for path in [dir.path(), &data, &data.join("a.txt")] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let me = nix::unistd::geteuid();
    let (uid, gid) = match me.is_root() {
        true => (nix::unistd::Uid::from_raw(65534), nix::unistd::Gid::from_raw(65534)),
        false => (me, nix::unistd::getegid()),
    };
    let view = super::ReadOnlyView::for_ids(std::slice::from_ref(&data), uid, gid).unwrap();
    assert!(!view.root, "not root: the binds are made in the user namespace");
    let mut command = std::process::Command::new("sh");
    // Absolute paths: a working folder entered before the bind would still be the writable one.
    command.env("D", &data).arg("-c").arg(
        "id -u; id -g; cat \"$D/a.txt\"; echo x > \"$D/a.txt\" || echo refused; \
         touch \"$D/b.txt\" || echo refused",
    );
    if me.is_root() {
        command.uid(uid.as_raw()).gid(gid.as_raw());
    }
    // SAFETY: system calls only, on memory prepared before the fork. Changing user made the
    // child undumpable, which gives `/proc/self` to root; a worker that is not root never
    // changes user.
    unsafe {
        command.pre_exec(move || {
            libc::prctl(libc::PR_SET_DUMPABLE, 1);
            view.enter()
        });
    }
    let output = command.output().expect("sh in the view (unprivileged user namespaces on)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stdout, format!("{uid}\n{gid}\nkeptrefused\nrefused\n"), "stderr: {stderr}");
    assert_eq!(stderr.matches("Read-only file system").count(), 2, "{stderr}");
    assert_eq!(std::fs::read_to_string(data.join("a.txt")).unwrap(), "kept");
    assert!(!data.join("b.txt").exists());
}

/// The doors the view must hold against a script run as root (the worker's user here): a
/// remount or unmount (no `CAP_SYS_ADMIN`, locked binds) and the folder reached through
/// `/proc/<pid>/root` of a process outside the runtime's namespaces.
#[test]
fn a_root_runtime_cannot_undo_the_view_or_go_round_it() {
    use std::os::unix::process::CommandExt;

    let me = nix::unistd::geteuid();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("a.txt"), "kept").unwrap();
    // A process of the same user outside the view, whose root is the writable folder.
    let mut neighbour = std::process::Command::new("sleep").arg("60").spawn().unwrap();
    let view =
        super::ReadOnlyView::for_ids(std::slice::from_ref(&data), me, nix::unistd::getegid())
            .unwrap();
    let mut command = std::process::Command::new("sh");
    command.env("D", &data).env("N", neighbour.id().to_string()).arg("-c").arg(
        "grep CapEff /proc/self/status; \
         echo x > \"/proc/$N/root$D/a.txt\" || echo refused; \
         mount -o remount,rw,bind \"$D\" || echo refused; \
         umount -l \"$D\" || echo refused; \
         echo x > \"$D/a.txt\" || echo refused",
    );
    // SAFETY: system calls only, on memory prepared before the fork.
    unsafe {
        command.pre_exec(move || view.enter());
    }
    let output = command.output();
    neighbour.kill().unwrap();
    neighbour.wait().unwrap();
    let output = output.expect("sh in the view (user namespaces on)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let caps = stdout.lines().next().and_then(|line| line.split_whitespace().nth(1));
    let caps = u64::from_str_radix(caps.unwrap_or("?"), 16).expect("CapEff in /proc/self/status");
    assert_eq!(caps & (1 << 21), 0, "CAP_SYS_ADMIN is dropped: {stdout}");
    assert_eq!(stdout.matches("refused").count(), 4, "stdout: {stdout}\nstderr: {stderr}");
    assert_eq!(std::fs::read_to_string(data.join("a.txt")).unwrap(), "kept");
}

#[test]
fn only_errors_that_forbid_namespaces_are_remembered() {
    let os = std::io::Error::from_raw_os_error;
    for refusal in [libc::EPERM, libc::EACCES, libc::ENOSYS, libc::EINVAL, libc::EUSERS] {
        assert!(refuses_for_good(&os(refusal)), "{}", os(refusal));
    }
    for one_off in [libc::ENOENT, libc::ENOTDIR, libc::ELOOP, libc::ENOMEM, libc::EAGAIN] {
        assert!(!refuses_for_good(&os(one_off)), "{}", os(one_off));
    }
    assert!(!refuses_for_good(&std::io::Error::other("not from the kernel")));
}
