//! The kernels redirector runs on: the features it needs, the release that brought each, and
//! the check made before the object is loaded, so that an old kernel gets a message naming
//! what it lacks instead of a verifier log.

use std::fmt;

/// The oldest kernel the privileged suites pass on (`cargo xtask vm`, Debian's 6.1). Older
/// kernels are refused: by the features they lack, or as untested when they lack none.
pub const MINIMUM: Release = Release(6, 1, 0);

/// Skips the check, for kernels that carry the features under an older version number
/// (distribution backports) or to try an untested one. Loading still fails if a feature is
/// really missing, with the verifier's message.
pub const ALLOW_ENV: &str = "REDIRECTOR_ALLOW_UNTESTED_KERNEL";

/// A kernel feature the object uses and the mainline release that brought it.
pub struct Feature {
    pub name: &'static str,
    pub since: Release,
}

/// Every feature the object needs, oldest first.
pub const FEATURES: &[Feature] = &[
    Feature {
        name: "cgroup connect4/connect6 programs",
        since: Release(4, 17, 0),
    },
    Feature {
        name: "cgroup sendmsg4/sendmsg6 programs",
        since: Release(4, 18, 0),
    },
    Feature {
        name: "cgroup recvmsg4/recvmsg6 programs",
        since: Release(5, 2, 0),
    },
    Feature {
        name: "cgroup getsockopt programs",
        since: Release(5, 3, 0),
    },
    Feature {
        name: "BPF links for cgroup programs, replaced with BPF_LINK_UPDATE",
        since: Release(5, 7, 0),
    },
    Feature {
        name: "cgroup getpeername4/getpeername6 programs",
        since: Release(5, 8, 0),
    },
    Feature {
        name: "sk_lookup programs",
        since: Release(5, 9, 0),
    },
    Feature {
        name: "bpf_get_netns_cookie in sock_ops and cgroup sockopt programs",
        since: Release(5, 15, 0),
    },
    Feature {
        name: "ingress_ifindex in sk_lookup programs",
        since: Release(5, 17, 0),
    },
];

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
        "Linux {release} is too old for redirector (Linux {MINIMUM} or newer is required): it lacks {missing}"
    )]
    MissingFeatures { release: String, missing: String },
    #[error(
        "Linux {release} is older than {MINIMUM}, the oldest kernel redirector is tested on; it has \
         the features redirector uses by version, so set {ALLOW_ENV}=1 to run on it anyway"
    )]
    Untested { release: String },
}

/// Checks a kernel release (`uname -r`) against [`MINIMUM`] and [`FEATURES`]. A release
/// that is not a version (a custom kernel) passes: there is nothing to judge it by.
pub fn check(release: &str) -> Result<(), KernelError> {
    let Some(found) = Release::parse(release) else {
        return Ok(());
    };
    if found >= MINIMUM {
        return Ok(());
    }
    let missing: Vec<String> = FEATURES
        .iter()
        .filter(|f| f.since > found)
        .map(|f| format!("{} (Linux {})", f.name, f.since))
        .collect();
    if missing.is_empty() {
        Err(KernelError::Untested {
            release: release.to_owned(),
        })
    } else {
        Err(KernelError::MissingFeatures {
            release: release.to_owned(),
            missing: missing.join(", "),
        })
    }
}

/// [`check`] for the running kernel, unless [`ALLOW_ENV`] is set.
pub fn check_running() -> Result<(), KernelError> {
    if std::env::var_os(ALLOW_ENV).is_some() {
        return Ok(());
    }
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return Ok(()); // No procfs: loading will tell.
    };
    check(release.trim())
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

    #[test]
    fn the_minimum_and_newer_pass() {
        for r in [
            "6.1.0-28-amd64",
            "6.1.0",
            "6.12.48+deb12-amd64",
            "6.18.3",
            "7.0",
        ] {
            check(r).unwrap_or_else(|e| panic!("{r}: {e}"));
        }
        check("not-a-version").unwrap();
    }

    #[test]
    fn an_old_kernel_is_told_what_it_lacks() {
        let err = check("5.10.0-33-amd64").unwrap_err().to_string();
        assert!(err.contains("Linux 5.10.0-33-amd64 is too old"), "{err}");
        assert!(err.contains("Linux 6.1 or newer is required"), "{err}");
        assert!(
            err.contains(
                "bpf_get_netns_cookie in sock_ops and cgroup sockopt programs (Linux 5.15)"
            ),
            "{err}"
        );
        assert!(
            err.contains("ingress_ifindex in sk_lookup programs (Linux 5.17)"),
            "{err}"
        );
        assert!(!err.contains("sk_lookup programs (Linux 5.9)"), "{err}");

        let err = check("4.19.0").unwrap_err().to_string();
        assert!(
            err.contains("cgroup getsockopt programs (Linux 5.3)"),
            "{err}"
        );
    }

    #[test]
    fn a_kernel_with_every_feature_but_untested_is_refused_with_the_override() {
        let err = check("5.19.0-50-generic").unwrap_err().to_string();
        assert!(err.contains("older than 6.1"), "{err}");
        assert!(err.contains(ALLOW_ENV), "{err}");
    }

    #[test]
    fn features_are_listed_oldest_first_and_all_predate_the_minimum() {
        assert!(FEATURES.windows(2).all(|w| w[0].since <= w[1].since));
        assert!(FEATURES.iter().all(|f| f.since <= MINIMUM));
    }
}
