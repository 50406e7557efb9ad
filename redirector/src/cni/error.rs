//! CNI errors: the spec's JSON error result with its well-known codes.

use serde::Serialize;

/// Codes of the CNI specification (its section "Error"); 100+ are the plugin's own.
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const INVALID_ENV: u32 = 4;
    pub const DECODE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    pub const NOT_AVAILABLE: u32 = 50;
    /// Setting the pod up (or checking or removing it) failed.
    pub const SETUP_FAILED: u32 = 100;
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct CniError {
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    pub code: u32,
    pub msg: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        CniError {
            cni_version: super::VERSION.to_owned(),
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    /// The error as answered to a configuration of `version`.
    pub fn in_version(mut self, version: &str) -> Self {
        version.clone_into(&mut self.cni_version);
        self
    }

    pub fn details(mut self, details: impl ToString) -> Self {
        self.details = details.to_string();
        self
    }
}
