//! The running kernel is checked before anything is loaded: on a kernel older than the
//! supported minimum (`cargo xtask vm --kernel 5.10`) redirector exits 1 naming the features
//! the kernel lacks and leaves nothing behind; on a supported one the same run sets the pod up.

use redirector::sys::kernel::{Release, MINIMUM};
use redirector_tests::bpftool::cgroup_attachments;
use redirector_tests::redirector::{istio_iptables, pins_under, PinRoot, STANDARD_INJECTION};
use redirector_tests::{require_root, Topology};

#[test]
fn an_unsupported_kernel_is_refused_by_name_and_a_supported_one_is_used() {
    if !require_root() {
        return;
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let release = release.trim();
    let running = Release::parse(release).expect("the running kernel's release is a version");
    let topo = Topology::new("kernel");
    let root = PinRoot::new("kernel");
    let out = istio_iptables(&topo.pod, &topo.pod_cgroup, &root, &STANDARD_INJECTION);
    let log = String::from_utf8_lossy(&out.stderr);
    if running >= MINIMUM {
        assert!(out.status.success(), "Linux {release}: {log}");
        assert_eq!(cgroup_attachments(topo.pod_cgroup.path()).len(), 6);
        return;
    }
    eprintln!("Linux {release} is older than {MINIMUM}: redirector said: {log}");
    assert_eq!(out.status.code(), Some(1), "{log}");
    if running < Release(5, 17, 0) {
        assert!(
            log.contains(&format!("Linux {release} is too old for redirector")),
            "{log}"
        );
        assert!(log.contains(&format!("Linux {MINIMUM} or newer")), "{log}");
        assert!(
            log.contains("ingress_ifindex in sk_lookup programs (Linux 5.17)"),
            "{log}"
        );
    } else {
        assert!(log.contains(redirector::sys::kernel::ALLOW_ENV), "{log}");
    }
    assert!(cgroup_attachments(topo.pod_cgroup.path()).is_empty());
    assert_eq!(pins_under(root.path()), Vec::<std::path::PathBuf>::new());
}
