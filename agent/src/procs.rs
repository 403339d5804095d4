//! The process groups the agent starts (engines of the process runtime, and
//! loadgen), each with a pid file, so that an agent restarted after a kill
//! finds and stops what its earlier life left running before it takes work.
//! A pid file holds the group leader's pid and its start time (from
//! `/proc`), so a pid the kernel has since reused for something else is
//! never signalled.

use std::path::PathBuf;
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process_group, test_kill_process_group};

/// Where pid files are kept.
#[derive(Clone, Debug)]
pub struct PidDir(pub PathBuf);

/// One recorded process group; removed once the group is stopped.
#[derive(Debug)]
pub struct PidFile {
    path: PathBuf,
    pgid: Option<Pid>,
}

impl PidDir {
    /// Records a process group whose leader is `pid`, under a name unique
    /// among the agent's children.
    pub fn record(&self, name: &str, pid: u32) -> std::io::Result<PidFile> {
        std::fs::create_dir_all(&self.0)?;
        let started = start_time(pid).unwrap_or(0);
        let path = self.0.join(format!("{}.pid", sanitize(name)));
        std::fs::write(&path, format!("{pid} {started}\n"))?;
        Ok(PidFile { path, pgid: Pid::from_raw(pid as i32) })
    }

    /// Stops every process group an earlier life of the agent left (those
    /// whose leader still runs with the recorded start time), and removes
    /// the pid files. Returns what was stopped, for the log.
    pub async fn sweep(&self, grace: Duration) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.0) else { return Vec::new() };
        let mut stopped = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "pid") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let mut words = text.split_whitespace();
            let pid: Option<u32> = words.next().and_then(|w| w.parse().ok());
            let started: Option<u64> = words.next().and_then(|w| w.parse().ok());
            if let (Some(pid), Some(started)) = (pid, started)
                && start_time(pid) == Some(started)
                && let Some(pgid) = Pid::from_raw(pid as i32)
            {
                stop_group(pgid, grace).await;
                stopped.push(format!("{} (pid {pid})", path.file_stem().unwrap_or_default().to_string_lossy()));
            }
            let _ = std::fs::remove_file(&path);
        }
        stopped
    }
}

impl PidFile {
    /// The group is stopped: forget it.
    pub fn remove(self) {
        let _ = std::fs::remove_file(&self.path);
    }

    pub fn group(&self) -> Option<Pid> {
        self.pgid
    }
}

/// SIGTERM to the group, SIGKILL once `grace` has passed with any of it
/// left (at once where the signal cannot be sent).
pub async fn stop_group(pgid: Pid, grace: Duration) {
    if kill_process_group(pgid, Signal::TERM).is_ok() {
        let deadline = tokio::time::Instant::now() + grace;
        while tokio::time::Instant::now() < deadline {
            if test_kill_process_group(pgid).is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let _ = kill_process_group(pgid, Signal::KILL);
}

/// A process's start time in clock ticks since boot (`/proc/PID/stat`,
/// field 22); `None` when it is gone (or a zombie).
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after
    // the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// `name` as a file name: what is not plainly safe in one becomes `_`.
pub(crate) fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' { c } else { '_' }).collect()
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt as _;

    use super::*;

    #[tokio::test]
    async fn a_sweep_stops_what_an_earlier_life_left_and_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pids = PidDir(dir.path().join("pids"));
        let mut child = std::process::Command::new("sleep").arg("1000").process_group(0).spawn().expect("sleep starts");
        pids.record("engine one", child.id()).expect("recorded");
        // A stale file naming a pid that is not that process any more.
        std::fs::write(dir.path().join("pids/stale.pid"), format!("{} 1\n", std::process::id())).expect("write");
        let stopped = pids.sweep(Duration::from_secs(5)).await;
        assert_eq!(stopped, [format!("engine_one (pid {})", child.id())]);
        let status = child.wait().expect("reaped");
        assert!(!status.success(), "the left-over group was stopped");
        assert_eq!(std::fs::read_dir(dir.path().join("pids")).expect("dir").count(), 0, "pid files removed");
    }

    #[test]
    fn start_times_are_read_past_odd_command_names() {
        let me = start_time(std::process::id()).expect("this process has one");
        assert!(me > 0);
        assert_eq!(start_time(u32::MAX - 1), None);
    }
}
