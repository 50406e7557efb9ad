//! Commands timed as whole processes, as a pod's setup runs them.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Instant;

use redirector_tests::NetNs;

/// Runs `cmd` (with `stdin`), panics unless it exits 0; returns its wall time in ms.
pub fn timed(cmd: &mut Command, stdin: Option<&str>) -> f64 {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let ms = start.elapsed().as_secs_f64() * 1e3;
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ms
}

pub fn nsenter(netns: &NetNs) -> Command {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net={}", netns.path().display()));
    cmd
}
