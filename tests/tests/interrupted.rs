//! An apply or a cleanup killed (SIGKILL) at every one of its steps, then run again: the
//! pod ends in the state the second run asked for — never half — and nothing leaks
//! (staged pins, links, programs, maps). Steps are counted by the binary itself
//! (`REDIRECTOR_KILL_AT_STEP`, debug builds only), so every step is hit exactly.

use std::os::unix::process::ExitStatusExt;
use std::process::Output;

use redirector::sys::fault::KILL_AT_STEP_ENV;
use redirector_tests::prelude::*;
use redirector_tests::redirector::status;

const EXCLUDED: u16 = 8080;

/// The standard injection with outbound port 8080 and a CIDR excluded (more entries in
/// more maps, so more steps).
fn with_exclusion() -> Vec<&'static str> {
    let mut args: Vec<&str> = STANDARD_INJECTION.to_vec();
    let x = args
        .iter()
        .position(|a| *a == "-x")
        .expect("the standard injection has -x");
    args[x + 1] = "10.250.0.0/16";
    args.extend(["-o", "8080"]);
    args
}

/// The run killed at `step`; `None` when it finished before reaching it.
fn killed_at(pod: &ProxiedPod, root: &PinRoot, args: &[&str], step: u32) -> Option<Output> {
    let step = step.to_string();
    let out = pod.istio_iptables_with_env(root, args, (KILL_AT_STEP_ENV, step.as_ref()));
    if out.status.signal() == Some(9) {
        return Some(out);
    }
    assert_success(&out);
    None
}

fn staged_pins(root: &PinRoot) -> Vec<PathBuf> {
    pins_under(root.path())
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("staging"))
        .collect()
}

/// Captured with 8080 excluded (`excluded`) or not: every link there once, and real
/// connections behave so.
#[track_caller]
fn assert_state(pod: &ProxiedPod, root: &PinRoot, excluded: bool, step: u32) {
    // A killed run's unpinned links detach when the kernel frees them, which it does
    // asynchronously after the process is gone (later on a loaded machine).
    let mut attached = 0;
    within(EVENTUALLY, || {
        attached = cgroup_attachments(pod.topo.pod_cgroup.path()).len();
        attached == 6
    });
    assert_eq!(attached, 6, "step {step}");
    assert_eq!(staged_pins(root), Vec::<PathBuf>::new(), "step {step}");
    let svc = pod.service(false);
    assert_proxied(&pod.connect(APP_UID, APP_UID, svc), svc);
    let other = SocketAddr::new(svc.ip(), EXCLUDED);
    let outcome = pod.connect(APP_UID, APP_UID, other);
    if excluded {
        assert_direct(&outcome, other);
    } else {
        assert_proxied(&outcome, other);
    }
}

#[test]
fn an_apply_killed_at_any_step_is_finished_by_the_next_run() {
    privileged!();
    let root = PinRoot::new("killapply");
    let pod = ProxiedPod::new("killapply");
    pod.install(&root, &STANDARD_INJECTION);
    let links_before = loaded_ids("link").len();
    let change = with_exclusion();
    let mut args = change.clone();
    args.push("--force-apply");
    let mut steps = 0;
    for step in 1.. {
        if killed_at(&pod, &root, &args, step).is_none() {
            break;
        }
        steps = step;
        // The next run (a restarted init container) finishes the change.
        pod.install(&root, &change);
        assert_state(&pod, &root, true, step);
        // Back to the old configuration for the next step.
        pod.install(&root, &STANDARD_INJECTION);
        assert_state(&pod, &root, false, step);
    }
    assert!(steps >= 10, "only {steps} steps were interrupted");
    eprintln!("interrupted an apply at each of its {steps} steps");
    let objects = status(&root)["objects"].as_array().unwrap().len();
    assert_eq!(objects, 1);
    // Links of killed runs are gone once their pins are (nothing else holds them).
    let leaked: Vec<u64> = loaded_ids("link").into_iter().collect();
    assert!(
        leaked.len() <= links_before + 1,
        "links: {} before, {} after",
        links_before,
        leaked.len()
    );
}

#[test]
fn a_cleanup_killed_at_any_step_is_finished_by_the_next_run() {
    privileged!();
    let root = PinRoot::new("killclean");
    let pod = ProxiedPod::new("killclean");
    let mut steps = 0;
    for step in 1.. {
        pod.install(&root, &with_exclusion());
        let ids: Vec<u64> = pins_under(root.path())
            .iter()
            .filter(|p| p.to_string_lossy().contains("/links/"))
            .map(|p| pinned_id("link", p))
            .collect();
        let killed = killed_at(&pod, &root, &["--cleanup-only"], step);
        if killed.is_some() {
            steps = step;
            pod.install(&root, &["--cleanup-only"]);
        }
        assert_eq!(
            cgroup_attachments(pod.topo.pod_cgroup.path()).len(),
            0,
            "step {step}"
        );
        assert_eq!(
            pins_under(root.path()),
            Vec::<PathBuf>::new(),
            "step {step}"
        );
        assert_eq!(
            wait_gone("link", &ids, EVENTUALLY),
            Vec::<u64>::new(),
            "step {step}: links left"
        );
        pod.assert_app_direct(false);
        if killed.is_none() {
            break;
        }
    }
    assert!(steps >= 5, "only {steps} steps were interrupted");
    eprintln!("interrupted a cleanup at each of its {steps} steps");
}

#[test]
fn the_first_pod_killed_while_the_object_loads_is_set_up_by_the_next_run() {
    privileged!();
    let pod = ProxiedPod::new("killload");
    let mut steps = 0;
    for step in 1.. {
        // A fresh node each time: the run must load the object.
        let root = PinRoot::new("killload");
        let killed = killed_at(&pod, &root, &STANDARD_INJECTION, step);
        // Past the object's own steps the run is an ordinary apply, covered above.
        let in_load = killed
            .as_ref()
            .is_some_and(|out| String::from_utf8_lossy(&out.stderr).contains("of a new object"));
        if killed.is_some() {
            steps = step;
            pod.install(&root, &STANDARD_INJECTION);
        }
        let objects = pins_under(&root.path().join("objects"));
        assert!(
            objects
                .iter()
                .all(|p| !p.to_string_lossy().contains("staging")),
            "step {step}: {objects:?}"
        );
        assert_state(&pod, &root, false, step);
        pod.install(&root, &["--cleanup-only"]);
        if !in_load {
            break;
        }
    }
    assert!(steps >= 10, "only {steps} steps were interrupted");
    eprintln!(
        "interrupted the first pod's object load at each of its {} steps",
        steps - 1
    );
}
