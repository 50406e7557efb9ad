//! The kernels redirector runs on: the features it needs, the release that brought each, and
//! the check made before the object is loaded — each feature probed on the running kernel
//! (a version number is wrong both ways on distribution kernels) — so that a kernel lacking
//! one gets a message naming it instead of a verifier log.

use std::fmt;

use crate::sys::kernel_probe::{attach, helper, prog_type, Probe, SK_LOOKUP_INGRESS_IFINDEX};

/// Goes on although a probe found a required feature missing: for a kernel where a probe
/// is wrong. Loading then fails with the verifier's message if the feature really is.
pub const ALLOW_ENV: &str = "REDIRECTOR_ALLOW_UNTESTED_KERNEL";

/// A kernel feature redirector uses, the mainline release that brought it, and how the
/// running kernel is asked whether it has it.
pub struct Feature {
    /// A short name, for [`FORCE_FALLBACKS_ENV`].
    pub key: &'static str,
    pub name: &'static str,
    pub since: Release,
    pub probe: Probe,
    /// What is done instead where the kernel lacks it; `None`: it is required.
    pub fallback: Option<&'static str>,
}

/// The [`Feature::key`]s code asks about.
pub mod keys {
    pub const MEMCG: &str = "memcg";
    pub const SO_NETNS_COOKIE: &str = "so-netns-cookie";
    pub const NETNS_COOKIE_SOCK_OPS: &str = "netns-cookie-sock-ops";
    pub const NETNS_COOKIE_GETSOCKOPT: &str = "netns-cookie-getsockopt";
    pub const INGRESS_IFINDEX: &str = "ingress-ifindex";
}

/// The fallback for the netns cookie in sock_ops and getsockopt programs.
const POD_COOKIE_ON_CGROUP: &str =
    "the pod's netns cookie stamped on its cgroup (cgroup storage), read by sock_ops and getsockopt";

/// BPF memory charged to memcg (5.11): libbpf's sign of it is a helper of the same release.
const MEMCG: Feature = Feature {
    key: keys::MEMCG,
    name: "BPF memory charged to the cgroup (memcg)",
    since: Release(5, 11, 0),
    probe: Probe::Helper {
        prog_type: prog_type::SOCKET_FILTER,
        attach: attach::NONE,
        helper: helper::KTIME_GET_COARSE_NS,
    },
    fallback: Some("RLIMIT_MEMLOCK raised for the loader"),
};

/// Every feature redirector uses, oldest first.
pub const FEATURES: &[Feature] = &[
    Feature {
        key: "connect",
        name: "cgroup connect4/connect6 programs",
        since: Release(4, 17, 0),
        probe: Probe::Program {
            prog_type: prog_type::CGROUP_SOCK_ADDR,
            attach: attach::CGROUP_INET4_CONNECT,
        },
        fallback: None,
    },
    Feature {
        key: "sendmsg",
        name: "cgroup sendmsg4/sendmsg6 programs",
        since: Release(4, 18, 0),
        probe: Probe::Program {
            prog_type: prog_type::CGROUP_SOCK_ADDR,
            attach: attach::CGROUP_UDP4_SENDMSG,
        },
        fallback: None,
    },
    Feature {
        key: "recvmsg",
        name: "cgroup recvmsg4/recvmsg6 programs",
        since: Release(5, 2, 0),
        probe: Probe::Program {
            prog_type: prog_type::CGROUP_SOCK_ADDR,
            attach: attach::CGROUP_UDP4_RECVMSG,
        },
        fallback: None,
    },
    Feature {
        key: "getsockopt",
        name: "cgroup getsockopt programs",
        since: Release(5, 3, 0),
        probe: Probe::Program {
            prog_type: prog_type::CGROUP_SOCKOPT,
            attach: attach::CGROUP_GETSOCKOPT,
        },
        fallback: None,
    },
    Feature {
        key: "cgroup-links",
        name: "BPF links for cgroup programs, replaced with BPF_LINK_UPDATE",
        since: Release(5, 7, 0),
        probe: Probe::LinkCreate,
        fallback: None,
    },
    Feature {
        key: "getpeername",
        name: "cgroup getpeername4/getpeername6 programs",
        since: Release(5, 8, 0),
        probe: Probe::Program {
            prog_type: prog_type::CGROUP_SOCK_ADDR,
            attach: attach::CGROUP_INET4_GETPEERNAME,
        },
        fallback: None,
    },
    Feature {
        key: "sk-lookup",
        name: "sk_lookup programs",
        since: Release(5, 9, 0),
        probe: Probe::Program {
            prog_type: prog_type::SK_LOOKUP,
            attach: attach::SK_LOOKUP,
        },
        fallback: None,
    },
    MEMCG,
    Feature {
        key: keys::SO_NETNS_COOKIE,
        name: "the SO_NETNS_COOKIE socket option",
        since: Release(5, 14, 0),
        probe: Probe::SocketOption(libc::SO_NETNS_COOKIE),
        fallback: Some(
            "a namespace's cookie stamped on a socket made in it by a cgroup sock_create program",
        ),
    },
    Feature {
        key: keys::NETNS_COOKIE_SOCK_OPS,
        name: "bpf_get_netns_cookie in sock_ops programs",
        since: Release(5, 15, 0),
        probe: Probe::Helper {
            prog_type: prog_type::SOCK_OPS,
            attach: attach::CGROUP_SOCK_OPS,
            helper: helper::GET_NETNS_COOKIE,
        },
        fallback: Some(POD_COOKIE_ON_CGROUP),
    },
    Feature {
        key: keys::NETNS_COOKIE_GETSOCKOPT,
        name: "bpf_get_netns_cookie in cgroup getsockopt programs",
        since: Release(5, 15, 0),
        probe: Probe::Helper {
            prog_type: prog_type::CGROUP_SOCKOPT,
            attach: attach::CGROUP_GETSOCKOPT,
            helper: helper::GET_NETNS_COOKIE,
        },
        fallback: Some(POD_COOKIE_ON_CGROUP),
    },
    Feature {
        key: keys::INGRESS_IFINDEX,
        name: "ingress_ifindex in sk_lookup programs",
        since: Release(5, 17, 0),
        probe: Probe::ContextField {
            prog_type: prog_type::SK_LOOKUP,
            attach: attach::SK_LOOKUP,
            offset: SK_LOOKUP_INGRESS_IFINDEX,
        },
        fallback: Some(
            "\"arrived on lo\" told by the destination address; -c and -k refused for a pod",
        ),
    },
];

/// Names the features (their [`Feature::key`], comma-separated, or `all`) whose fallback
/// is used although the kernel has them: so that the suites exercise every fallback on the
/// kernels CI runs, not only on an old one. Features with no fallback are not affected.
pub const FORCE_FALLBACKS_ENV: &str = "REDIRECTOR_FORCE_FALLBACKS";

/// Whether `feature`'s fallback is forced by [`FORCE_FALLBACKS_ENV`].
fn fallback_forced(feature: &Feature) -> bool {
    feature.fallback.is_some()
        && std::env::var(FORCE_FALLBACKS_ENV).is_ok_and(|v| {
            v.split(',')
                .map(str::trim)
                .any(|k| k == "all" || k == feature.key)
        })
}

/// Names the features (keys, comma-separated, or `all`) the probes report missing although
/// the kernel has them: a test's way to stand on a kernel redirector refuses (a required
/// feature refused) on the kernel it has.
pub const FORCE_REFUSAL_ENV: &str = "REDIRECTOR_FORCE_REFUSAL";

/// Whether [`FORCE_REFUSAL_ENV`] names `feature`.
fn refusal_forced(feature: &Feature) -> bool {
    std::env::var(FORCE_REFUSAL_ENV).is_ok_and(|v| {
        v.split(',')
            .map(str::trim)
            .any(|k| k == "all" || k == feature.key)
    })
}

/// Whether the fallback of the feature with `key` is forced by [`FORCE_FALLBACKS_ENV`] (no
/// probe: for a caller whose own attempt is the probe).
pub fn fallback_forced_for(key: &str) -> bool {
    fallback_forced(feature(key))
}

/// Whether the running kernel has `feature`, as its probe says, or not when its fallback
/// (or its refusal) is forced.
fn present(feature: &Feature) -> std::io::Result<bool> {
    if fallback_forced(feature) || refusal_forced(feature) {
        return Ok(false);
    }
    let found = crate::sys::kernel_probe::run(feature.probe);
    match found {
        // A probe's program load refused past RLIMIT_MEMLOCK (before 5.11): asked again
        // with the limit raised.
        Err(err) if err.raw_os_error() == Some(libc::EPERM) && feature.key != keys::MEMCG => {
            raise_memlock_where_needed();
            crate::sys::kernel_probe::run(feature.probe)
        }
        found => found,
    }
}

/// The feature with `key` (one of [`keys`]).
fn feature(key: &str) -> &'static Feature {
    FEATURES
        .iter()
        .find(|f| f.key == key)
        .unwrap_or_else(|| panic!("no kernel feature {key}"))
}

/// The feature with `key` as a person reads it: `name (Linux x.y)`.
pub fn describe(key: &str) -> String {
    let feature = feature(key);
    format!("{} (Linux {})", feature.name, feature.since)
}

/// Whether the fallback of the feature with `key` is to be used: forced by
/// [`FORCE_FALLBACKS_ENV`], or the running kernel lacks the feature (probed now: one tiny
/// program load or socket option; a probe that cannot tell keeps the feature).
pub fn needs_fallback(key: &str) -> bool {
    !present(feature(key)).unwrap_or(true)
}

/// Before BPF memory was charged to the cgroup (5.11) maps and programs counted against
/// RLIMIT_MEMLOCK, whose default (8 MiB, or 64 KiB on older systems) a node's object
/// exceeds: raised for this process there — to unlimited, or to the hard limit where the
/// process may not raise that — and left alone where the kernel charges memcg. Raised too
/// where the probe cannot tell: there the charge is per user and the limit per process, so
/// once root's objects hold more than a process's limit every load of another root
/// process is refused, the probe's included. Once per process. Best effort: a limit still
/// too low shows up as the load's own error.
pub fn raise_memlock_where_needed() {
    static RAISED: std::sync::Once = std::sync::Once::new();
    RAISED.call_once(raise_memlock_unless_memcg);
}

fn raise_memlock_unless_memcg() {
    if present(&MEMCG).is_ok_and(|present| present) {
        return;
    }
    let mut limit = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit/getrlimit with a valid rlimit value.
    unsafe {
        if libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) == 0 {
            return;
        }
        if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) == 0 {
                return;
            }
        }
    }
    tracing::warn!(
        "raising RLIMIT_MEMLOCK for a kernel without memcg accounting of BPF memory: {}",
        std::io::Error::last_os_error()
    );
}

/// What a probe found for one feature.
#[derive(Debug, serde::Serialize)]
pub struct Probed {
    pub feature: &'static str,
    /// Whether redirector needs it (it has no fallback).
    pub required: bool,
    /// The mainline release that brought it.
    pub since: String,
    /// `None` when the probe could not tell (see `error`).
    pub present: Option<bool>,
    /// In use on this kernel: it lacks the feature and this stands in.
    pub fallback: Option<&'static str>,
    pub error: Option<String>,
}

/// Every feature of [`FEATURES`], probed on the running kernel.
pub fn probe_running() -> Vec<Probed> {
    FEATURES
        .iter()
        .map(|f| {
            let found = present(f);
            let present = found.as_ref().ok().copied();
            Probed {
                feature: f.name,
                required: f.fallback.is_none(),
                since: f.since.to_string(),
                present,
                fallback: f.fallback.filter(|_| present == Some(false)),
                error: found.err().map(|e| e.to_string()),
            }
        })
        .collect()
}

/// A kernel release as `major.minor.patch`; what follows the numbers (`-28-amd64`,
/// `+deb12-rt-amd64`) is ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Release(pub u32, pub u32, pub u32);

impl Release {
    /// Parses `uname -r`: `6.1.0-28-amd64`, `6.12.48+deb12-rt-amd64`, `5.10.0`.
    pub fn parse(release: &str) -> Option<Release> {
        let mut parts = release.splitn(3, '.').map(|p| {
            let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u32>().ok()
        });
        let major = parts.next()??;
        let minor = parts.next()??;
        let patch = parts.next().flatten().unwrap_or(0);
        Some(Release(major, minor, patch))
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.0, self.1)?;
        if self.2 != 0 {
            write!(f, ".{}", self.2)?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(
        "Linux {release} lacks kernel features redirector needs, as probed: {missing} (set \
         {ALLOW_ENV}=1 to go on if a probe is wrong about this kernel)"
    )]
    MissingFeatures { release: String, missing: String },
}

/// The required features (those with no fallback) that `probed` found missing, each with
/// the mainline release that brought it; a probe that could not tell is not counted.
pub fn missing_required(probed: &[Probed]) -> Vec<String> {
    FEATURES
        .iter()
        .zip(probed)
        .filter(|(f, p)| f.fallback.is_none() && p.present == Some(false))
        .map(|(f, _)| format!("{} (Linux {})", f.name, f.since))
        .collect()
}

/// Probes the running kernel and refuses it if it lacks a required feature, unless
/// [`ALLOW_ENV`] is set. About 12 tiny program loads: for a load of the object or a daemon's
/// start, not for every pod (see `PinRoot::check_kernel_unless_loaded`).
pub fn check_running() -> Result<(), KernelError> {
    if std::env::var_os(ALLOW_ENV).is_some() {
        return Ok(());
    }
    let missing = missing_required(&probe_running());
    if missing.is_empty() {
        return Ok(());
    }
    Err(KernelError::MissingFeatures {
        release: running_release(),
        missing: missing.join(", "),
    })
}

/// The running kernel's release (`uname -r`), or a placeholder where procfs is missing.
pub fn running_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|r| r.trim().to_owned())
        .unwrap_or_else(|_| "(unknown release)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_distribution_releases() {
        assert_eq!(Release::parse("6.1.0-28-amd64"), Some(Release(6, 1, 0)));
        assert_eq!(
            Release::parse("6.12.48+deb12-rt-amd64"),
            Some(Release(6, 12, 48))
        );
        assert_eq!(
            Release::parse("5.15.0-126-generic"),
            Some(Release(5, 15, 0))
        );
        assert_eq!(Release::parse("6.18"), Some(Release(6, 18, 0)));
        assert_eq!(Release::parse("custom"), None);
    }

    fn probed(absent: &[&str]) -> Vec<Probed> {
        FEATURES
            .iter()
            .map(|f| Probed {
                feature: f.name,
                required: f.fallback.is_none(),
                since: f.since.to_string(),
                present: Some(!absent.contains(&f.name)),
                fallback: None,
                error: None,
            })
            .collect()
    }

    #[test]
    fn only_required_features_found_missing_are_named() {
        assert!(missing_required(&probed(&[])).is_empty());
        let missing = missing_required(&probed(&[
            "sk_lookup programs",
            "ingress_ifindex in sk_lookup programs",
            "BPF memory charged to the cgroup (memcg)",
        ]));
        assert_eq!(missing, ["sk_lookup programs (Linux 5.9)"]);
        let mut unknown = probed(&[]);
        unknown[0].present = None;
        assert!(
            missing_required(&unknown).is_empty(),
            "a probe that could not tell"
        );
    }

    #[test]
    fn features_are_listed_oldest_first() {
        assert!(FEATURES.windows(2).all(|w| w[0].since <= w[1].since));
    }
}
