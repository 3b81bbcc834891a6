// The code state a result names: `git rev-parse HEAD`, with `-dirty` when tracked files outside
// `results/` and `runs/` have uncommitted changes (results being regenerated do not make a run's
// code uncertain). Included by `provenance.rs` and by `experiments/build.rs` (which records the
// state a binary is built from), so that both name a state by the same rule.

/// `git ARGS` run in `dir` (the current directory if `None`), its output trimmed, if git runs and
/// succeeds.
fn git_in(dir: Option<&std::path::Path>, args: &[&str]) -> Option<String> {
    let mut command = std::process::Command::new("git");
    command.args(args);
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let out = command.output().ok().filter(|o| o.status.success())?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The commit of the working tree at `dir`, `-dirty` as the file's comment says; `unknown`
/// outside a git checkout.
fn tree_commit(dir: Option<&std::path::Path>) -> String {
    let commit = git_in(dir, &["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git_in(
        dir,
        &[
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ":/",
            ":(top,exclude)results",
            ":(top,exclude)runs",
        ],
    )
    .is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{commit}-dirty")
    } else {
        commit
    }
}
