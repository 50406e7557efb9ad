//! Where configuration comes from besides argv: env vars and the account databases.
//!
//! Read through a trait so tests can use a map and never touch the process env.

use std::collections::HashMap;

use super::accounts;

/// The process environment as configuration sees it.
pub trait Env {
    /// The value of env var `name`, `None` when unset (or not UTF-8).
    fn var(&self, name: &str) -> Option<String>;

    /// The uid of the user account `name` (`ENVOY_USER`), from /etc/passwd by default.
    fn user_uid(&self, name: &str) -> Option<u32> {
        accounts::uid_by_name(name)
    }

    /// The gid of the group `name` (owner-group lists), from /etc/group by default.
    fn group_gid(&self, name: &str) -> Option<u32> {
        accounts::gid_by_name(name)
    }
}

/// The real process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

/// Env vars from a map; account names are still looked up on the system.
impl Env for HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
}

/// No env var at all: a node pod's settings come from its request alone.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoEnv;

impl Env for NoEnv {
    fn var(&self, _name: &str) -> Option<String> {
        None
    }
}
