//! The exit codes of commands the controller refuses, which follow its
//! answer's gRPC code, and of the same refusals met in the local store: a
//! run or agent that does not exist (4), a run whose state refuses the
//! command (5), a bad argument (2), no controller (3).

use std::process::Output;

use super::export::RunningController;
use super::{benchfleet, examples, text};

fn exits(out: &Output, code: i32, says: &str, what: &str) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{what}: {stderr}");
    assert!(stderr.contains(says), "{what}: expected {says:?} in:\n{stderr}");
}

#[test]
fn exit_codes_follow_the_controller_s_answer() {
    let (c, data) = (tempfile::tempdir().expect("c"), tempfile::tempdir().expect("data"));
    // The controller's store is the one the local commands read later.
    let controller = RunningController::start(&c.path().join("store"));
    let url = controller.url.clone();
    let remote = |args: &[&str]| {
        let mut all = vec!["--controller", url.as_str()];
        all.extend_from_slice(args);
        benchfleet(data.path(), &all)
    };

    // No such run or agent: NOT_FOUND, exit 4.
    for (args, says) in [
        (&["retry", "99"][..], "run 99 does not exist"),
        (&["cancel", "99"], "run 99 does not exist"),
        (&["jobs", "99"], "run 99 does not exist"),
        (&["report", "99"], "run 99 not found"),
        (&["drain", "nobody"], "no agent named 'nobody'"),
        (&["undrain", "agent-9"], "no agent named 'agent-9'"),
    ] {
        exits(&remote(args), 4, says, &args.join(" "));
    }
    // Not a run id: INVALID_ARGUMENT, exit 2.
    exits(&remote(&["retry", "seven"]), 2, "'seven' is not a run id", "retry seven");

    // A run no agent takes stays running: what needs it over is refused,
    // FAILED_PRECONDITION, exit 5.
    let matrix = examples().join("quickstart.yaml");
    let submitted = remote(&["submit", matrix.to_str().expect("utf-8 path")]);
    assert!(submitted.status.success(), "submit: {}", text(&submitted.stderr));
    let run = text(&submitted.stdout).trim().to_owned();
    exits(&remote(&["retry", &run]), 5, &format!("run {run} is still running"), "retry of a running run");
    exits(&remote(&["export", &run]), 5, &format!("run {run} is still running"), "export of a running run");
    let cancelled = remote(&["cancel", &run]);
    assert!(cancelled.status.success(), "cancel: {}", text(&cancelled.stderr));
    exits(&remote(&["cancel", &run]), 5, &format!("run {run} is not running"), "cancel of a cancelled run");
    controller.stop();

    // The local store gives the same codes as the controller would.
    let local = |args: &[&str]| benchfleet(c.path(), args);
    exits(&local(&["jobs", "99"]), 4, "run 99 does not exist", "local jobs 99");
    exits(&local(&["report", "99"]), 4, "run 99 not found", "local report 99");
    exits(&local(&["export", "99"]), 4, "run 99 does not exist", "local export 99");
    exits(&local(&["jobs", "seven"]), 2, "'seven' is not a run id", "local jobs seven");

    // No controller there: exit 3.
    exits(&remote(&["retry", "99"]), 3, "cannot reach the controller", "retry with the controller gone");
}
