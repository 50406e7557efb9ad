//! Pieces of the effective-configuration display every mesh's command logs, each in its
//! mesh's own vocabulary.

use std::{
    fmt::{self, Display},
    path::Path,
};

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

/// The lines, one per line: a configuration's `Display`.
pub fn write_lines(f: &mut fmt::Formatter<'_>, lines: Vec<String>) -> fmt::Result {
    for line in lines {
        writeln!(f, "{line}")?;
    }
    Ok(())
}
