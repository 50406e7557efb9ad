//! The node's report as `redirector check` prints it.

use std::fmt::Write as _;

use super::{NodeReport, Outcome};

/// One line a requirement (its outcome, name and what was found), a line for what to do
/// under a failed one, then the verdict.
pub fn render_text(report: &NodeReport) -> String {
    let mut text = String::new();
    for check in &report.checks {
        let outcome = match check.outcome {
            Outcome::Pass => "pass",
            Outcome::Fail => "FAIL",
            Outcome::Note => "    ",
        };
        let _ = writeln!(text, "{outcome}  {:<19} {}", check.name, check.found);
        if let Some(fix) = &check.fix {
            let _ = writeln!(text, "      {:<19} → {fix}", "");
        }
    }
    match &report.unservable {
        None => text.push_str("this node can be served\n"),
        Some(unservable) => {
            let _ = writeln!(text, "{unservable}");
        }
    }
    text
}

/// Whether a runtime calls a plugin's CNI STATUS, which holds the node NotReady while it
/// fails: containerd from 2.0 does; 1.x and others do not (as far as known).
pub fn calls_cni_status(name: &str, version: &str) -> String {
    let major = version
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok());
    match (name, major) {
        ("containerd", Some(major)) if major >= 2 => {
            "calls CNI STATUS: a failing STATUS holds the node's network NotReady".to_owned()
        }
        ("containerd", Some(_)) => "does not call CNI STATUS (containerd 1.x)".to_owned(),
        _ => "whether it calls CNI STATUS is not known".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_check::{Check, Reason, Unservable};

    #[test]
    fn containerd_2_calls_status_and_1_does_not() {
        assert!(calls_cni_status("containerd", "v2.0.4").starts_with("calls"));
        assert!(calls_cni_status("containerd", "1.6.20~ds1").starts_with("does not"));
        assert!(calls_cni_status("cri-o", "1.31.0").contains("not known"));
    }

    #[test]
    fn a_failed_requirement_shows_what_to_do_and_the_verdict_names_it() {
        let report = NodeReport {
            checks: vec![
                Check::pass("cgroup v2", "mounted at /sys/fs/cgroup"),
                Check::fail(
                    "bpffs",
                    Reason::Bpffs,
                    "/tmp/x is not on a bpffs mount",
                    "mount bpffs",
                ),
            ],
            node_cgroup: None,
            unservable: Some(Unservable {
                reason: Reason::Bpffs,
                detail: "bpffs: /tmp/x is not on a bpffs mount".into(),
            }),
        };
        let text = render_text(&report);
        assert!(text.contains("pass  cgroup v2"), "{text}");
        assert!(text.contains("FAIL  bpffs"), "{text}");
        assert!(text.contains("→ mount bpffs"), "{text}");
        assert!(
            text.ends_with(
                "this node cannot be served (bpffs): bpffs: /tmp/x is not on a bpffs mount\n"
            ),
            "{text}"
        );
    }
}
