//! The running kernel is probed before anything is loaded: on a kernel that lacks a feature
//! with no fallback (Debian 11's 5.10: `cargo xtask vm --kernel 5.10`) redirector exits 1
//! naming the features as probed and leaves nothing behind; on one with them all the same run
//! sets the pod up. `redirector status` shows each feature as the kernel's own probe found it.

use redirector::sys::kernel::{Release, FORCE_FALLBACKS_ENV};
use redirector_tests::prelude::*;
use redirector_tests::redirector::status;

/// The required features (no fallback) `status` found missing: `name (Linux x.y)` each.
fn missing_required(status: &serde_json::Value) -> Vec<String> {
    status["kernel"]["features"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["present"] == false && f["fallback"].is_null())
        .map(|f| {
            format!(
                "{} (Linux {})",
                f["feature"].as_str().unwrap(),
                f["since"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn an_unsupported_kernel_is_refused_by_name_and_a_supported_one_is_used() {
    privileged!();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let release = release.trim();
    let topo = Topology::new("kernel");
    let root = PinRoot::new("kernel");
    let missing = missing_required(&status(&root));
    let out = istio_iptables(&topo.pod, &topo.pod_cgroup, &root, &STANDARD_INJECTION);
    let log = String::from_utf8_lossy(&out.stderr);
    if missing.is_empty() {
        assert!(out.status.success(), "Linux {release}: {log}");
        assert_eq!(cgroup_attachments(topo.pod_cgroup.path()).len(), 6);
        return;
    }
    eprintln!("Linux {release} lacks {missing:?}: redirector said: {log}");
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert_contains(
        &log,
        format!(
            "Linux {release} lacks kernel features redirector needs, as probed: {}",
            missing.join(", ")
        ),
    );
    assert!(log.contains(redirector::sys::kernel::ALLOW_ENV), "{log}");
    assert!(cgroup_attachments(topo.pod_cgroup.path()).is_empty());
    assert_eq!(pins_under(root.path()), Vec::<PathBuf>::new());
}

/// The probes load real programs on the running kernel. Debian's kernels (the host's and
/// the VMs': 5.10, 6.1, 6.12) carry each feature from its mainline release on, so there
/// every probe must agree with the release — both ways: on 5.10 the newer ones are absent.
#[test]
fn status_shows_each_feature_as_the_kernels_probe_found_it() {
    privileged!();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let running = Release::parse(release.trim()).expect("the running kernel's release");
    let root = PinRoot::new("probes");
    let status = status(&root);
    assert_eq!(status["kernel"]["release"], release.trim());
    let features = status["kernel"]["features"].as_array().unwrap();
    assert_eq!(features.len(), redirector::sys::kernel::FEATURES.len());
    for probed in features {
        let since = Release::parse(probed["since"].as_str().unwrap()).unwrap();
        assert_eq!(
            probed["present"],
            serde_json::Value::Bool(since <= running),
            "Linux {running}: {probed}"
        );
        // A fallback is shown only where it stands in for a missing feature.
        if since <= running {
            assert!(probed["fallback"].is_null(), "{probed}");
        }
    }
}

/// A probe says no when the kernel refuses what it asks: a helper id no kernel has, a
/// context field past the end of the context. (So the yeses above are the kernel's.)
#[test]
fn a_probe_answers_no_for_what_no_kernel_has() {
    privileged!();
    use redirector::sys::kernel_probe::{attach, prog_type, run, Probe};
    let no_such_helper = Probe::Helper {
        prog_type: prog_type::SOCK_OPS,
        attach: attach::CGROUP_SOCK_OPS,
        helper: 100_000,
    };
    assert!(!run(no_such_helper).unwrap());
    let past_the_context = Probe::ContextField {
        prog_type: prog_type::SK_LOOKUP,
        attach: attach::SK_LOOKUP,
        offset: 4000,
    };
    assert!(!run(past_the_context).unwrap());
    let no_such_option = Probe::SocketOption(10_000);
    assert!(!run(no_such_option).unwrap());
}

/// The soft RLIMIT_MEMLOCK of process `pid`, from /proc (`None`: unlimited).
fn memlock_soft_limit(pid: u32) -> Option<u64> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))
        .expect("a memlock line");
    let soft = line["Max locked memory".len()..]
        .split_whitespace()
        .next()
        .unwrap();
    soft.parse().ok()
}

/// A fallback forced by REDIRECTOR_FORCE_FALLBACKS is shown by `status` and used: with the
/// memcg one forced, a daemon that loads the object raises its memlock limit from the
/// 64 KiB it started with, as it would on a kernel without memcg accounting; without it
/// the limit is left as it was.
#[test]
fn a_forced_fallback_is_shown_and_used() {
    privileged!();
    let root = PinRoot::new("forced");
    let status_json = format!("status --json --pin-root {}", root.path().display());
    let out = redirector(&status_json)
        .env(FORCE_FALLBACKS_ENV, "memcg")
        .output();
    assert_success(&out);
    let forced: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let unforced = status(&root);
    for (f, u) in forced["kernel"]["features"]
        .as_array()
        .unwrap()
        .iter()
        .zip(unforced["kernel"]["features"].as_array().unwrap())
    {
        if f["feature"] == "BPF memory charged to the cgroup (memcg)" {
            assert_eq!(f["present"], false, "{f}");
            assert_eq!(f["fallback"], "RLIMIT_MEMLOCK raised for the loader");
        } else {
            assert_eq!(f, u, "only the forced feature changes");
        }
    }

    if !missing_required(&unforced).is_empty() {
        return; // A kernel redirector refuses runs no daemon.
    }
    let memcg_fallback_needed = unforced["kernel"]["features"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| {
            f["feature"] == "BPF memory charged to the cgroup (memcg)" && !f["fallback"].is_null()
        });
    // Children inherit the test's soft limit; the hard one is left as it is.
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit value.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) },
        0
    );
    let saved = limit;
    let low = 64 * 1024;
    limit.rlim_cur = low.min(saved.rlim_max);
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) }, 0);
    let started = |env: &[(&str, &str)]| {
        let TestNode { root, node, state } = TestNode::new("memlock");
        let daemon = Daemon::start_with_env(&root, &node, &state, &[], env);
        let soft = memlock_soft_limit(daemon.pid());
        (soft, daemon, root, node, state)
    };
    let (plain, ..) = started(&[]);
    let (raised, ..) = started(&[(FORCE_FALLBACKS_ENV, "memcg")]);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &saved) }, 0);
    let hard = (saved.rlim_max != libc::RLIM_INFINITY).then_some(saved.rlim_max);
    assert!(
        raised.is_none() || raised == hard,
        "the fallback raises the soft limit to unlimited or the hard limit ({hard:?}): {raised:?}"
    );
    if memcg_fallback_needed {
        // The kernel lacks it (before 5.11): the daemon raises the limit either way.
        assert_eq!(plain, raised);
    } else {
        assert_eq!(
            plain,
            Some(limit.rlim_cur),
            "no fallback: the limit as inherited"
        );
    }
}

/// Without SO_NETNS_COOKIE (before Linux 5.14) a namespace's cookie is stamped on a socket
/// made in it by a cgroup sock_create program, attached for that moment at the process's
/// own cgroup. Forced, it finds the cookie the option gives (on a kernel without the
/// option, the one the unforced run finds the same way), and leaves nothing attached.
#[test]
fn a_netns_cookie_stamped_by_the_fallback_is_the_kernels() {
    privileged!();
    let netns = NetNs::new("cookie");
    let cgroup = Cgroup::new("cookie");
    let root = PinRoot::new("cookie");
    // The cookie a dry-run cleanup of the namespace names, run in `cgroup`.
    let cookie_read = |forced: Option<&str>| {
        let (netns, pins) = (netns.path(), root.path());
        let (netns, pins) = (netns.display(), pins.display());
        let dry_run = format!(
            "istio-iptables --cleanup-only --dry-run --network-namespace {netns} --pin-root {pins}"
        );
        let mut run = redirector(&dry_run).cgroup(&cgroup);
        if let Some(keys) = forced {
            run = run.env(FORCE_FALLBACKS_ENV, keys);
        }
        let out = run.output();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{forced:?}: {log}");
        log.split("of pod netns ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|cookie| cookie.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{forced:?}: no netns cookie in: {log}"))
    };
    let plain = cookie_read(None);
    assert_ne!(plain, 0);
    use redirector::sys::kernel_probe::{run, Probe};
    if run(Probe::SocketOption(libc::SO_NETNS_COOKIE)).unwrap() {
        assert_eq!(plain, netns.cookie(), "SO_NETNS_COOKIE");
    }
    assert_eq!(cookie_read(Some("so-netns-cookie")), plain);
    assert_eq!(cookie_read(Some("all")), plain);
    assert_eq!(
        cgroup_attachments(cgroup.path()),
        Vec::new(),
        "the stamp left attached"
    );
}

/// With every fallback forced, as on a kernel before 5.14, the three programs are loaded
/// as their variants and still do their work: an app's connection reaches the proxy, which
/// reads the original destination through SO_ORIGINAL_DST (sock_ops and getsockopt finding
/// the pod by the cookie stamped on its cgroup). The node cgroup cannot carry one pod's
/// cookie, so a daemon refuses a pod with no cgroup of its own (exit 1, naming why) and
/// nothing of it is attached.
#[test]
fn with_every_fallback_forced_the_variants_capture_and_a_pod_needs_its_own_cgroup() {
    privileged!();
    let pod = ProxiedPod::new("allfb");
    let root = PinRoot::new("allfb");
    let all = (FORCE_FALLBACKS_ENV, "all".as_ref());
    assert_success(&pod.istio_iptables_with_env(&root, &STANDARD_INJECTION, all));
    assert_eq!(
        status(&root)["objects"][0]["variants"],
        serde_json::json!([
            "track_sock_ops_cgroup_cookie",
            "answer_getsockopt_cgroup_cookie",
            "steer_sk_lookup_by_address"
        ])
    );
    for v6 in [false, true] {
        pod.assert_app_proxied(v6);
    }

    let TestNode { root, node, state } = TestNode::new("allfbd");
    let daemon = Daemon::start_with_env(&root, &node, &state, &[], &[(FORCE_FALLBACKS_ENV, "all")]);
    let bare = NetNs::new("allfbbare");
    let netns = bare.path().display().to_string();
    let out = daemon.pod(&["add", "--netns", &netns, "--name", "default/bare", "--"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot be attached at") && stderr.contains("each pod needs its own"),
        "{stderr}"
    );
    assert!(cgroup_attachments(node.path()).is_empty());
    assert!(daemon.pod_names().is_empty(), "{:?}", daemon.pod_names());
}
