//! Pieces of the effective-configuration display every mesh's command logs, each in its
//! mesh's own vocabulary.

use std::{fmt::Display, path::Path};

use super::RunOptions;
use crate::engine::spec::CaptureConfig;

/// A list as the meshes print one: entries joined by commas.
pub fn joined<T: Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// An optional path as printed: empty when not set.
pub fn optional_path(path: Option<&Path>) -> String {
    path.map(|p| p.display().to_string()).unwrap_or_default()
}

/// redirector's own settings, last in every mesh's display, by flag name (`fail-open`,
/// `cgroup`, `pin-root`) with their values; each mesh writes the names its own way.
pub fn own_settings(capture: &CaptureConfig, run: &RunOptions) -> [(&'static str, String); 3] {
    [
        ("fail-open", capture.fail_open.to_string()),
        ("cgroup", optional_path(run.cgroup.as_deref())),
        ("pin-root", run.pin_root.display().to_string()),
    ]
}
