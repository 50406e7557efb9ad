//! Why a mesh's settings for a pod cannot be used.

/// A pod's flags, a network's keys or a pod's annotations a mesh refuses.
#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    /// The flags do not read as the mesh's own command reads them: the message names the
    /// flag and the value.
    #[error("{}", .0.to_string().trim())]
    Flags(Box<dyn std::error::Error + Send + Sync>),
    /// A run option of the mesh's command that a pod the daemon or the plugin manages
    /// cannot have.
    #[error("{0} is not accepted by the daemon")]
    NotForTheDaemon(&'static str),
    /// A network configuration's key or a pod's annotation: the message names it.
    #[error("{0}")]
    Settings(String),
}

impl MeshError {
    /// A mesh's own configuration error.
    pub fn flags(err: impl std::error::Error + Send + Sync + 'static) -> Self {
        MeshError::Flags(Box::new(err))
    }
}
