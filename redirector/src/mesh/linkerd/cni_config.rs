//! linkerd-cni's settings: the `"linkerd": {…}` object of its conflist entry, turned into
//! proxy-init flags.
//!
//! linkerd-cni (`cni-plugin/main.go` of linkerd/linkerd2-proxy-init, struct `ProxyInit`)
//! decodes the object with Go's `encoding/json` and hands the fields to proxy-init's own
//! options, never through proxy-init's command line. The keys are exactly proxy-init's long
//! flag names (`json:"incoming-proxy-port"` and so on); linkerd-cni has no camelCase
//! spelling of them, so there is none to accept here. As Go's decoder does, keys match
//! without regard to ASCII case. The linkerd2-cni chart writes, by default:
//!
//! ```json
//! { "incoming-proxy-port": 4143, "outgoing-proxy-port": 4140, "proxy-uid": 2102,
//!   "ports-to-redirect": [], "inbound-ports-to-ignore": ["4191","4190"],
//!   "simulate": false, "use-wait-flag": false, "iptables-mode": "nft", "ipv6": false }
//! ```
//!
//! (`"proxy-gid"` only when its value is set, `"outbound-ports-to-ignore"` only when not
//! empty.)

use serde_json::Value;

/// The JSON type of one of linkerd-cni's keys (its Go field's type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Go `int`: a JSON integer.
    Int,
    /// Go `[]int`.
    IntList,
    /// Go `[]string`.
    TextList,
    /// Go `bool`.
    Bool,
    /// Go `string`.
    Text,
}

/// linkerd-cni's keys, in its struct's order (the order of the flags produced).
const KEYS: [(&str, Kind); 12] = [
    ("incoming-proxy-port", Kind::Int),
    ("outgoing-proxy-port", Kind::Int),
    ("proxy-uid", Kind::Int),
    ("proxy-gid", Kind::Int),
    ("ports-to-redirect", Kind::IntList),
    ("inbound-ports-to-ignore", Kind::TextList),
    ("outbound-ports-to-ignore", Kind::TextList),
    ("subnets-to-ignore", Kind::TextList),
    ("simulate", Kind::Bool),
    ("use-wait-flag", Kind::Bool),
    ("iptables-mode", Kind::Text),
    ("ipv6", Kind::Bool),
];

/// linkerd-cni's `"linkerd"` object as proxy-init flags (`--key=value`; lists comma-joined,
/// empty lists left out). A key linkerd-cni does not have, a value of the wrong JSON type,
/// or a missing proxy port is an error naming the key.
///
/// A key left out (or `null`) is Go's zero value there, not proxy-init's default: no
/// `"ipv6"` means IPv6 off (`--ipv6=false`), and no proxy port would be port 0, a redirect
/// to nowhere, so it is refused instead. No `"proxy-uid"`/`"proxy-gid"` is 0, which
/// exempts no one, as proxy-init's -1 does.
pub fn proxy_init_args(linkerd: &Value) -> Result<Vec<String>, String> {
    let Value::Object(object) = linkerd else {
        return Err(format!(
            "the \"linkerd\" settings must be an object of proxy-init flags, got {}",
            type_name(linkerd)
        ));
    };
    let mut given: [Option<(&str, &Value)>; KEYS.len()] = [None; KEYS.len()];
    for (key, value) in object {
        let at = KEYS
            .iter()
            .position(|(name, _)| name.eq_ignore_ascii_case(key))
            .ok_or_else(|| {
                format!(
                    "unknown key {key:?} in the \"linkerd\" settings (linkerd-cni's keys: {})",
                    KEYS.map(|(name, _)| name).join(", ")
                )
            })?;
        if let Some((earlier, _)) = given[at] {
            return Err(format!(
                "{key:?} and {earlier:?} in the \"linkerd\" settings are the same key"
            ));
        }
        if !value.is_null() {
            given[at] = Some((key.as_str(), value));
        }
    }
    let mut args = Vec::new();
    for ((flag, kind), value) in KEYS.iter().zip(given) {
        let Some((key, value)) = value else {
            match *flag {
                "incoming-proxy-port" | "outgoing-proxy-port" => {
                    return Err(format!(
                        "the \"linkerd\" settings have no {flag:?}: linkerd-cni would redirect to port 0"
                    ))
                }
                "ipv6" => args.push("--ipv6=false".to_owned()),
                _ => {}
            }
            continue;
        };
        let wrong_type = || {
            format!(
                "\"linkerd\".{key:?} must be {}, got {value}",
                expected(*kind)
            )
        };
        let text = match kind {
            Kind::Int => integer(value).ok_or_else(wrong_type)?.to_string(),
            Kind::Bool => value.as_bool().ok_or_else(wrong_type)?.to_string(),
            Kind::Text => value.as_str().ok_or_else(wrong_type)?.to_owned(),
            Kind::IntList | Kind::TextList => {
                let items = value.as_array().ok_or_else(wrong_type)?;
                let entries: Option<Vec<String>> = items
                    .iter()
                    .map(|item| match kind {
                        Kind::IntList => integer(item).map(|n| n.to_string()),
                        _ => item.as_str().map(str::to_owned),
                    })
                    .collect();
                // Go hands each element to proxy-init as one entry; joined here, an
                // element holding a comma becomes several entries (`"4190,4191"` is two
                // ports, where proxy-init would drop it as one bad entry).
                entries.ok_or_else(wrong_type)?.join(",")
            }
        };
        // An empty list is no entry; an empty iptables mode is linkerd-cni's "not set"
        // (it then uses legacy, which this dialect ignores anyway).
        if text.is_empty() {
            continue;
        }
        args.push(format!("--{flag}={text}"));
    }
    Ok(args)
}

/// A JSON number Go decodes into an `int`: an integer in int64's range (not `4143.0`,
/// not `"4143"`).
fn integer(value: &Value) -> Option<i64> {
    value.as_i64()
}

fn expected(kind: Kind) -> &'static str {
    match kind {
        Kind::Int => "an integer",
        Kind::IntList => "a list of integers",
        Kind::TextList => "a list of strings",
        Kind::Bool => "true or false",
        Kind::Text => "a string",
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}
