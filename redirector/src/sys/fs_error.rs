//! A filesystem or bpffs operation that failed: what was done, to which path, and why.

use std::{fmt::Display, io, path::Path};

#[derive(Debug, thiserror::Error)]
#[error("{action} {path}: {source}")]
pub struct FsError {
    action: &'static str,
    path: String,
    source: io::Error,
}

impl FsError {
    pub fn new(action: &'static str, path: impl Display, source: io::Error) -> Self {
        FsError {
            action,
            path: path.to_string(),
            source,
        }
    }

    /// The kind of the underlying error, e.g. `NotFound`.
    pub fn kind(&self) -> io::ErrorKind {
        self.source.kind()
    }
}

/// For `map_err`: the failure of `action` on `path`.
pub fn fs_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> FsError + 'a {
    move |source| FsError::new(action, path.display(), source)
}

/// A removal's result, with its target already gone counted as done.
pub fn gone_ok(result: io::Result<()>) -> io::Result<()> {
    match result {
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}
