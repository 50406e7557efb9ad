//! What a process holds, from /proc: resident memory by kind, threads, descriptors.

/// A process's resources at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Held {
    pub rss_kib: u64,
    pub anon_kib: u64,
    pub file_kib: u64,
    pub threads: u64,
    pub fds: u64,
}

impl Held {
    /// Process `pid`'s, or why it could not be read (the process is gone).
    pub fn of(pid: u32) -> Result<Held, String> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map_err(|e| format!("reading /proc/{pid}/status: {e}"))?;
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map_err(|e| format!("listing /proc/{pid}/fd: {e}"))?
            .count() as u64;
        Ok(Held {
            fds,
            ..from_status(&status)
        })
    }
}

/// The memory and thread fields of a /proc/PID/status text.
fn from_status(status: &str) -> Held {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    Held {
        rss_kib: field("VmRSS"),
        anon_kib: field("RssAnon"),
        file_kib: field("RssFile"),
        threads: field("Threads"),
        fds: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_by_name() {
        let status = "Name:\tredirector\nVmRSS:\t   10784 kB\nRssAnon:\t    4096 kB\nRssFile:\t    6688 kB\nRssShmem:\t       0 kB\nThreads:\t5\n";
        let held = from_status(status);
        assert_eq!(
            held,
            Held {
                rss_kib: 10_784,
                anon_kib: 4_096,
                file_kib: 6_688,
                threads: 5,
                fds: 0
            }
        );
    }

    #[test]
    fn this_process_is_readable() {
        let held = Held::of(std::process::id()).unwrap();
        assert!(
            held.rss_kib > 0 && held.threads >= 1 && held.fds >= 3,
            "{held:?}"
        );
    }
}
