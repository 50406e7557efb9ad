//! `--log-level` and `--log-format` as proxy-init reads them (logrus' level names, any
//! format other than `json` is plain).

use std::fmt;

/// A logrus level. `panic` and `fatal` log what `error` does: redirector never panics or
/// exits from a log call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Panic,
    Fatal,
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    /// logrus' `ParseLevel`: case-insensitive, `warning` for `warn`; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text.to_ascii_lowercase().as_str() {
            "panic" => LogLevel::Panic,
            "fatal" => LogLevel::Fatal,
            "error" => LogLevel::Error,
            "warn" | "warning" => LogLevel::Warn,
            "info" => LogLevel::Info,
            "debug" => LogLevel::Debug,
            "trace" => LogLevel::Trace,
            _ => return None,
        })
    }

    /// The `tracing` filter directive for this level.
    pub fn filter(self) -> &'static str {
        match self {
            LogLevel::Panic | LogLevel::Fatal | LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogLevel::Panic => "panic",
            LogLevel::Fatal => "fatal",
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        })
    }
}

/// `--log-format`: `json`, or plain text for anything else (proxy-init's `getFormatter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Plain,
    Json,
}

impl LogFormat {
    pub fn parse(text: &str) -> Self {
        if text == "json" {
            LogFormat::Json
        } else {
            LogFormat::Plain
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogFormat::Plain => "plain",
            LogFormat::Json => "json",
        })
    }
}
