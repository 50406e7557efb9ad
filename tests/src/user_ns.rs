//! A user namespace of a pod's own (Kubernetes `hostUsers: false`): ids 0–65535 inside
//! are 100000–165535 on the host, and it owns a new network namespace, as a runtime makes
//! them for such a pod. A holder process keeps both alive.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The host id of id 0 inside.
pub const HOST_ID_BASE: u32 = 100_000;
const IDS: u32 = 65_536;

pub struct UserNs {
    holder: Child,
}

impl UserNs {
    pub fn new() -> Self {
        let mut cmd = Command::new("sleep");
        cmd.arg("infinity").stdin(Stdio::null());
        // SAFETY: unshare and prctl are async-signal-safe system calls.
        unsafe {
            cmd.pre_exec(|| {
                if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) != 0
                    || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let holder = cmd.spawn().expect("starting the user namespace's holder");
        let userns = UserNs { holder };
        for map in ["uid_map", "gid_map"] {
            let path = userns.proc_dir().join(map);
            std::fs::write(&path, format!("0 {HOST_ID_BASE} {IDS}\n"))
                .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        }
        userns
    }

    fn proc_dir(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}", self.holder.id()))
    }

    /// The user namespace, to join.
    pub fn path(&self) -> PathBuf {
        self.proc_dir().join("ns/user")
    }

    /// The network namespace it owns.
    pub fn netns_file(&self) -> PathBuf {
        self.proc_dir().join("ns/net")
    }
}

impl Default for UserNs {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for UserNs {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}
