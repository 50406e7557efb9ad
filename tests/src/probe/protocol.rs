//! The line protocol of the `probe` binary, written and read in one place.
//!
//! Servers print one line per event to stdout and send the same line to the client:
//! - `listening name=N addr=A` — a listener is ready (A has the real port when asked for 0);
//! - `served name=N local=L peer=P` — `probe serve` answered a connection;
//! - `proxied name=N local=L peer=P orig=O` — `probe proxy` accepted a connection; `O` is its
//!   `SO_ORIGINAL_DST` or `none:<errno>`; with `--forward` the line ends with
//!   ` upstream=<the upstream's line, or an error line>` (always last: it contains spaces).
//!
//! The client (`probe connect`) prints `reply <server line>` or `error <kind> <detail>`.

use std::net::SocketAddr;

/// Client error kinds, from the errno of connect/read.
pub mod error_kind {
    pub const REFUSED: &str = "refused";
    pub const TIMEOUT: &str = "timeout";
    /// EPERM/EACCES: what a cgroup program that rejects a connect produces.
    pub const PERMISSION: &str = "permission";
    pub const UNREACHABLE: &str = "unreachable";
    pub const RESET: &str = "reset";
    /// Connected, but the server closed without a line.
    pub const EMPTY: &str = "empty";
    /// Anything else.
    pub const IO: &str = "io";

    pub fn from_errno(errno: Option<i32>) -> &'static str {
        match errno {
            Some(libc::ECONNREFUSED) => REFUSED,
            Some(libc::ETIMEDOUT | libc::EAGAIN | libc::EINPROGRESS) => TIMEOUT,
            Some(libc::EPERM | libc::EACCES) => PERMISSION,
            Some(libc::ENETUNREACH | libc::EHOSTUNREACH | libc::EADDRNOTAVAIL) => UNREACHABLE,
            Some(libc::ECONNRESET | libc::EPIPE) => RESET,
            _ => IO,
        }
    }
}

pub fn listening_line(name: &str, addr: SocketAddr) -> String {
    format!("listening name={name} addr={addr}")
}

pub fn served_line(name: &str, local: SocketAddr, peer: SocketAddr) -> String {
    format!("served name={name} local={local} peer={peer}")
}

/// `orig` is the `SO_ORIGINAL_DST` result (errno on failure); `upstream` the forwarded reply.
pub fn proxied_line(
    name: &str,
    local: SocketAddr,
    peer: SocketAddr,
    orig: Result<SocketAddr, i32>,
    upstream: Option<&str>,
) -> String {
    let orig = match orig {
        Ok(addr) => addr.to_string(),
        Err(errno) => format!("none:{errno}"),
    };
    let mut line = format!("proxied name={name} local={local} peer={peer} orig={orig}");
    if let Some(upstream) = upstream {
        line.push_str(" upstream=");
        line.push_str(upstream);
    }
    line
}

pub fn reply_line(server_line: &str) -> String {
    format!("reply {server_line}")
}

pub fn error_line(kind: &str, detail: &str) -> String {
    format!("error {kind} {detail}")
}

/// `errno=N <message>`, or the message alone for an error without an errno.
pub fn describe_io_error(err: &std::io::Error) -> String {
    match err.raw_os_error() {
        Some(errno) => format!("errno={errno} {err}"),
        None => err.to_string(),
    }
}

/// The `error <kind> <detail>` line of a failed socket operation.
pub fn io_error_line(err: &std::io::Error) -> String {
    let kind = match err.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => error_kind::TIMEOUT,
        _ => error_kind::from_errno(err.raw_os_error()),
    };
    error_line(kind, &describe_io_error(err))
}

/// A `--*-ms` flag's value as a duration.
pub fn millis(value: &str) -> Result<std::time::Duration, std::num::ParseIntError> {
    value.parse().map(std::time::Duration::from_millis)
}

/// A server's `--name`, which its lines write as `name=NAME` among spaces.
pub fn server_name(name: &str) -> Result<String, String> {
    if name.is_empty() || name.contains(|c: char| c.is_whitespace() || c == '=') {
        return Err("must be non-empty, without spaces or '='".into());
    }
    Ok(name.to_owned())
}

/// A usage error's exit: clap's message, and 64 (0 for `--help`).
pub fn usage_exit(err: &clap::Error) -> std::process::ExitCode {
    let _ = err.print();
    std::process::ExitCode::from(if err.use_stderr() { 64 } else { 0 })
}

/// One event line to stdout, flushed at once so a test reading the pipe sees it now.
pub fn emit(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    // A test that stopped reading is no reason to stop serving.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// A client's exit: its line on stdout, then 0 for an answer, 2 for an error it reports.
pub fn client_exit(result: Result<String, String>) -> std::process::ExitCode {
    match result {
        Ok(line) => {
            emit(&line);
            std::process::ExitCode::SUCCESS
        }
        Err(line) => {
            emit(&line);
            std::process::ExitCode::from(2)
        }
    }
}

/// A client's report: the first non-empty line of its stdout, trimmed.
pub(crate) fn first_line(output: &str) -> &str {
    output
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
}

/// Parses a `listening` line into its name and address.
pub fn parse_listening(line: &str) -> Option<(String, SocketAddr)> {
    let fields = Fields::parse(line, "listening")?;
    Some((fields.get("name")?.to_owned(), fields.addr("addr")?))
}

/// What a client's connection landed on, as `probe connect` reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnOutcome {
    /// A `probe proxy` took it.
    Proxied {
        name: String,
        local: SocketAddr,
        peer: SocketAddr,
        /// `SO_ORIGINAL_DST`, `None` when the proxy could not read one.
        orig: Option<SocketAddr>,
        /// With `--forward`: what the proxy's own connection to `orig` landed on.
        upstream: Option<Box<ConnOutcome>>,
    },
    /// A `probe serve` answered it directly.
    Served {
        name: String,
        local: SocketAddr,
        peer: SocketAddr,
    },
    /// ECONNREFUSED.
    Refused,
    /// Any other failure: `<kind> <detail>` (kinds in [`error_kind`]).
    Error(String),
}

impl ConnOutcome {
    /// Parses the stdout of `probe connect` (its one line).
    pub fn parse(output: &str) -> ConnOutcome {
        let line = first_line(output);
        if let Some(server_line) = line.strip_prefix("reply ") {
            Self::from_server_line(server_line)
        } else if line.starts_with("error ") {
            Self::from_error_line(line)
        } else {
            ConnOutcome::Error(format!("unparsable probe output: {output:?}"))
        }
    }

    /// Parses a server's line (`served …`, `proxied …`) or an `error …` line.
    pub fn from_server_line(line: &str) -> ConnOutcome {
        if line.starts_with("error ") {
            return Self::from_error_line(line);
        }
        let parsed = if line.starts_with("served ") {
            Self::parse_served(line)
        } else {
            Self::parse_proxied(line)
        };
        parsed.unwrap_or_else(|| ConnOutcome::Error(format!("unparsable server line: {line:?}")))
    }

    fn from_error_line(line: &str) -> ConnOutcome {
        let rest = line.trim_start_matches("error ").trim();
        if rest.split_whitespace().next() == Some(error_kind::REFUSED) {
            ConnOutcome::Refused
        } else {
            ConnOutcome::Error(rest.to_owned())
        }
    }

    fn parse_served(line: &str) -> Option<ConnOutcome> {
        let fields = Fields::parse(line, "served")?;
        Some(ConnOutcome::Served {
            name: fields.get("name")?.to_owned(),
            local: fields.addr("local")?,
            peer: fields.addr("peer")?,
        })
    }

    fn parse_proxied(line: &str) -> Option<ConnOutcome> {
        let (head, upstream) = match line.split_once(" upstream=") {
            Some((head, upstream)) => (head, Some(Box::new(Self::from_server_line(upstream)))),
            None => (line, None),
        };
        let fields = Fields::parse(head, "proxied")?;
        let orig = fields.get("orig")?;
        let orig = if orig.starts_with("none:") {
            None
        } else {
            Some(orig.parse().ok()?)
        };
        Some(ConnOutcome::Proxied {
            name: fields.get("name")?.to_owned(),
            local: fields.addr("local")?,
            peer: fields.addr("peer")?,
            orig,
            upstream,
        })
    }

    /// The part of the outcome that must match between istio's iptables rules and redirector:
    /// which listener took the connection and which original destination it saw. Peers
    /// (ephemeral ports, and a source address that differs between REDIRECT and a connect-time
    /// rewrite) and the proxy's local address (REDIRECT rewrites it, sk_lookup does not) are
    /// left out.
    pub fn landing(&self) -> Landing {
        match self {
            ConnOutcome::Proxied {
                name,
                orig,
                upstream,
                ..
            } => Landing::Proxy {
                name: name.clone(),
                orig: *orig,
                upstream: upstream.as_ref().map(|u| Box::new(u.landing())),
            },
            ConnOutcome::Served { name, local, .. } => Landing::Service {
                name: name.clone(),
                local: *local,
            },
            ConnOutcome::Refused => Landing::Refused,
            ConnOutcome::Error(text) => Landing::Error {
                kind: text.split_whitespace().next().unwrap_or("").to_owned(),
            },
        }
    }
}

/// [`ConnOutcome`] reduced to what iptables and redirector must agree on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Landing {
    Proxy {
        name: String,
        orig: Option<SocketAddr>,
        upstream: Option<Box<Landing>>,
    },
    Service {
        name: String,
        local: SocketAddr,
    },
    Refused,
    Error {
        kind: String,
    },
}

/// `event key=value key=value …` with values free of spaces (also `dnsprobe`'s lines).
pub(crate) struct Fields<'a>(Vec<(&'a str, &'a str)>);

impl<'a> Fields<'a> {
    pub(crate) fn parse(line: &'a str, event: &str) -> Option<Self> {
        let mut words = line.split_whitespace();
        (words.next()? == event).then_some(())?;
        Some(Fields(words.filter_map(|w| w.split_once('=')).collect()))
    }

    pub(crate) fn get(&self, key: &str) -> Option<&'a str> {
        self.0.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }

    pub(crate) fn addr(&self, key: &str) -> Option<SocketAddr> {
        self.get(key)?.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn served_round_trip() {
        let line = served_line("svc", sa("10.200.1.2:80"), sa("10.200.1.1:40000"));
        assert_eq!(
            ConnOutcome::parse(&format!("{}\n", reply_line(&line))),
            ConnOutcome::Served {
                name: "svc".into(),
                local: sa("10.200.1.2:80"),
                peer: sa("10.200.1.1:40000")
            }
        );
    }

    #[test]
    fn proxied_with_ipv6_orig_and_none() {
        let line = proxied_line(
            "px",
            sa("[::1]:15001"),
            sa("[::1]:5000"),
            Ok(sa("[fd00:200:1::2]:80")),
            None,
        );
        let ConnOutcome::Proxied { orig, upstream, .. } = ConnOutcome::parse(&reply_line(&line))
        else {
            panic!("not proxied: {line}");
        };
        assert_eq!(orig, Some(sa("[fd00:200:1::2]:80")));
        assert_eq!(upstream, None);

        let line = proxied_line(
            "px",
            sa("127.0.0.1:15001"),
            sa("127.0.0.1:5000"),
            Err(libc::ENOENT),
            None,
        );
        assert!(line.contains("orig=none:2"), "{line}");
        assert!(matches!(
            ConnOutcome::parse(&reply_line(&line)),
            ConnOutcome::Proxied { orig: None, .. }
        ));
    }

    #[test]
    fn forwarded_nests_the_upstream() {
        let upstream = served_line("svc", sa("10.200.1.2:80"), sa("10.200.1.1:40000"));
        let line = proxied_line(
            "px",
            sa("127.0.0.1:15001"),
            sa("10.200.1.1:1234"),
            Ok(sa("10.200.1.2:80")),
            Some(&upstream),
        );
        let outcome = ConnOutcome::parse(&reply_line(&line));
        assert_eq!(
            outcome.landing(),
            Landing::Proxy {
                name: "px".into(),
                orig: Some(sa("10.200.1.2:80")),
                upstream: Some(Box::new(Landing::Service {
                    name: "svc".into(),
                    local: sa("10.200.1.2:80")
                })),
            }
        );
        let refused = proxied_line(
            "px",
            sa("127.0.0.1:15001"),
            sa("10.200.1.1:1234"),
            Ok(sa("10.200.1.2:81")),
            Some(&error_line("refused", "errno=111")),
        );
        let ConnOutcome::Proxied {
            upstream: Some(upstream),
            ..
        } = ConnOutcome::parse(&reply_line(&refused))
        else {
            panic!("no upstream");
        };
        assert_eq!(*upstream, ConnOutcome::Refused);
    }

    #[test]
    fn errors() {
        assert_eq!(
            ConnOutcome::parse("error refused errno=111 Connection refused"),
            ConnOutcome::Refused
        );
        let outcome = ConnOutcome::parse("error permission errno=1 Operation not permitted");
        assert_eq!(
            outcome.landing(),
            Landing::Error {
                kind: "permission".into()
            }
        );
        assert!(matches!(ConnOutcome::parse(""), ConnOutcome::Error(_)));
        assert_eq!(
            error_kind::from_errno(Some(libc::EPERM)),
            error_kind::PERMISSION
        );
    }

    #[test]
    fn listening() {
        assert_eq!(
            parse_listening(&listening_line("svc", sa("[::]:80"))),
            Some(("svc".into(), sa("[::]:80")))
        );
    }
}
