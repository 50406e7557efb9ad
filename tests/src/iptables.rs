//! istio's reference rule sets (`<golden dir>/*.golden`), applied inside a test netns.
//!
//! A golden file is the exact output of `istio-iptables` for one configuration:
//!
//! ```text
//! iptables-save          ┐ state dumps taken before applying: markers, not rules
//! ip6tables-save         ┘
//! * nat                  ┐
//! -N …                   │ IPv4 tables, each `* <table>` … `COMMIT`
//! COMMIT                 │ (nat; plus mangle and/or raw in some cases)
//! * raw … COMMIT         ┘
//! * nat … COMMIT         ┐ IPv6 tables (only when IPv6 is on): the same table sequence
//! * raw … COMMIT         ┘ again, with IPv6 addresses
//! iptables-save          ┐ state dumps taken after applying: `ip6tables-save` only when
//! ip6tables-save         ┘ IPv6 is on
//! ```
//!
//! No marker separates the IPv4 tables from the IPv6 ones, so the IPv6 section starts at the
//! first table header that repeats a table already seen (istio emits the IPv4 tables, then
//! the IPv6 tables, each table once per family). The split is cross-checked against the
//! trailing `ip6tables-save` marker.

use std::path::{Path, PathBuf};

use crate::{golden_dir, NetNs};

/// `<golden dir>/<case>.golden`, e.g. `golden_path("inbound-ports-wildcard")`.
pub fn golden_path(case: &str) -> PathBuf {
    golden_dir().join(format!("{case}.golden"))
}

/// The IPv4 and (when present) IPv6 `iptables-restore` inputs of a golden file.
pub fn golden_sections(path: &Path) -> (String, Option<String>) {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read golden file {}: {e}", path.display()));
    split_golden(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// [`golden_sections`] of `<golden dir>/<case>.golden`.
pub fn golden(case: &str) -> (String, Option<String>) {
    golden_sections(&golden_path(case))
}

/// Splits a golden file's text; see the module docs for the layout.
pub fn split_golden(text: &str) -> Result<(String, Option<String>), String> {
    let mut v4 = String::new();
    let mut v6 = String::new();
    let mut v4_tables: Vec<&str> = Vec::new();
    let mut in_v6 = false;
    let mut in_table = false;
    let mut seen_rules = false;
    let mut trailing_ip6_marker = false;
    for (number, raw) in text.lines().enumerate() {
        let line = raw.trim();
        match line {
            "" => continue,
            "iptables-save" => continue,
            "ip6tables-save" => {
                trailing_ip6_marker = seen_rules;
                continue;
            }
            _ => {}
        }
        if let Some(table) = line.strip_prefix('*') {
            if in_table {
                return Err(format!("line {}: table header inside a table", number + 1));
            }
            let table = table.trim();
            if !in_v6 && v4_tables.contains(&table) {
                in_v6 = true;
            }
            if !in_v6 {
                v4_tables.push(table);
            }
            in_table = true;
            seen_rules = true;
        } else if !in_table {
            return Err(format!("line {}: {line:?} outside a table", number + 1));
        }
        let section = if in_v6 { &mut v6 } else { &mut v4 };
        section.push_str(line);
        section.push('\n');
        if line == "COMMIT" {
            in_table = false;
        }
    }
    if in_table {
        return Err("last table has no COMMIT".into());
    }
    if in_v6 != trailing_ip6_marker {
        return Err(format!(
            "IPv6 tables {} but the trailing ip6tables-save marker is {}",
            if in_v6 { "found" } else { "not found" },
            if trailing_ip6_marker {
                "present"
            } else {
                "absent"
            }
        ));
    }
    Ok((v4, in_v6.then_some(v6)))
}

/// Inserts `rules` at the end of `table` (before its `COMMIT`) in a restore input.
pub fn append_rules(section: &str, table: &str, rules: &[&str]) -> String {
    let mut out = String::new();
    let mut current = None;
    let mut done = false;
    for line in section.lines() {
        if let Some(name) = line.strip_prefix('*') {
            current = Some(name.trim().to_owned());
        }
        if line == "COMMIT" && current.as_deref() == Some(table) && !done {
            rules.iter().for_each(|rule| {
                out.push_str(rule);
                out.push('\n');
            });
            done = true;
        }
        out.push_str(line);
        out.push('\n');
    }
    assert!(done, "no table {table:?} in:\n{section}");
    out
}

/// Inserts `rules` right after the line equal to `anchor`.
pub fn insert_after(section: &str, anchor: &str, rules: &[&str]) -> String {
    let mut out = String::new();
    let mut found = false;
    for line in section.lines() {
        out.push_str(line);
        out.push('\n');
        if line == anchor && !found {
            rules.iter().for_each(|rule| {
                out.push_str(rule);
                out.push('\n');
            });
            found = true;
        }
    }
    assert!(found, "no line {anchor:?} in:\n{section}");
    out
}

/// The rules of istio's standard sidecar injection,
/// `-p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -x "" -b '*' -d 15090,15021,15020`, as
/// CASES.md derives them: `inbound-ports-wildcard` plus RETURNs for 15090, 15021, 15020 after
/// the 15008 RETURN and a final `-A ISTIO_OUTPUT -j ISTIO_REDIRECT`. The IPv6 section is the
/// IPv4 one with istio's IPv6 loopbacks (`::6/128`, `::1/128`), which is exactly how the
/// golden IPv6 sections differ from the IPv4 ones when no CIDR or DNS option is set.
pub fn standard_injection() -> (String, String) {
    let (v4, _) = golden("inbound-ports-wildcard");
    let v4 = insert_after(
        &v4,
        "-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN",
        &[
            "-A ISTIO_INBOUND -p tcp --dport 15090 -j RETURN",
            "-A ISTIO_INBOUND -p tcp --dport 15021 -j RETURN",
            "-A ISTIO_INBOUND -p tcp --dport 15020 -j RETURN",
        ],
    );
    let v4 = append_rules(&v4, "nat", &["-A ISTIO_OUTPUT -j ISTIO_REDIRECT"]);
    let v6 = v4
        .replace("127.0.0.6/32", "::6/128")
        .replace("127.0.0.1/32", "::1/128");
    (v4, v6)
}

/// Feeds `v4` to `iptables-restore` and `v6` (if any) to `ip6tables-restore` inside `netns`;
/// panics with the tool's stderr and the input on failure. Tables the input names are
/// replaced (no `--noflush`), which in a fresh netns means exactly these rules.
pub fn apply_golden(netns: &NetNs, v4: &str, v6: Option<&str>) {
    netns.run_with_stdin(&["iptables-restore"], Some(v4));
    if let Some(v6) = v6 {
        netns.run_with_stdin(&["ip6tables-restore"], Some(v6));
    }
}

/// `iptables-save` (or `ip6tables-save`) output of `table` inside `netns`, for messages.
pub fn saved_rules(netns: &NetNs, v6: bool, table: &str) -> String {
    let tool = if v6 {
        "ip6tables-save"
    } else {
        "iptables-save"
    };
    netns.run(&[tool, "-t", table])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a token of `section` is an `A` address or CIDR.
    fn has_addr<A: std::str::FromStr>(section: &str) -> bool {
        section
            .split_whitespace()
            .any(|t| t.split('/').next().is_some_and(|a| a.parse::<A>().is_ok()))
    }

    #[test]
    fn every_golden_file_splits_consistently() {
        let dir = golden_dir();
        let Ok(entries) = std::fs::read_dir(&dir) else {
            eprintln!("note: no golden dir at {}; skipping", dir.display());
            return;
        };
        let mut count = 0;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "golden") {
                continue;
            }
            count += 1;
            let text = std::fs::read_to_string(&path).unwrap();
            let (v4, v6) = golden_sections(&path);
            let rules = |s: &str| s.lines().filter(|l| l.starts_with('-')).count();
            let all_rules = text.lines().filter(|l| l.starts_with('-')).count();
            assert_eq!(
                rules(&v4) + v6.as_deref().map_or(0, rules),
                all_rules,
                "{}",
                path.display()
            );
            assert!(
                !has_addr::<std::net::Ipv6Addr>(&v4),
                "IPv6 address in the IPv4 section of {}",
                path.display()
            );
            if let Some(v6) = &v6 {
                assert!(
                    !has_addr::<std::net::Ipv4Addr>(v6),
                    "IPv4 address in the IPv6 section of {}",
                    path.display()
                );
                let tables = |s: &str| {
                    s.lines()
                        .filter(|l| l.starts_with('*'))
                        .collect::<Vec<_>>()
                        .join(",")
                };
                assert_eq!(tables(&v4), tables(v6), "{}", path.display());
            }
        }
        assert!(
            count >= 20,
            "expected the golden files in {}",
            dir.display()
        );
    }

    #[test]
    fn split_rejects_inconsistent_markers() {
        let v4_only = "iptables-save\nip6tables-save\n* nat\n-N X\nCOMMIT\niptables-save\n";
        let (v4, v6) = split_golden(v4_only).unwrap();
        assert_eq!(v4, "* nat\n-N X\nCOMMIT\n");
        assert_eq!(v6, None);
        let both = "iptables-save\nip6tables-save\n* nat\n-N X\nCOMMIT\n* nat\n-N Y\nCOMMIT\niptables-save\nip6tables-save\n";
        assert_eq!(
            split_golden(both).unwrap().1.as_deref(),
            Some("* nat\n-N Y\nCOMMIT\n")
        );
        let missing_marker = "* nat\nCOMMIT\n* nat\nCOMMIT\niptables-save\n";
        assert!(split_golden(missing_marker).is_err());
    }

    #[test]
    fn standard_injection_orders_returns_before_capture() {
        if !golden_path("inbound-ports-wildcard").exists() {
            return;
        }
        let (v4, v6) = standard_injection();
        let inbound: Vec<&str> = v4
            .lines()
            .filter(|l| l.starts_with("-A ISTIO_INBOUND"))
            .collect();
        assert_eq!(inbound.len(), 5, "{v4}");
        assert!(inbound[4].ends_with("-j ISTIO_IN_REDIRECT"), "{v4}");
        let nat_end: Vec<&str> = v4.lines().rev().take(2).collect();
        assert_eq!(nat_end, ["COMMIT", "-A ISTIO_OUTPUT -j ISTIO_REDIRECT"]);
        assert!(v6.contains("-s ::6/128") && !v6.contains("127.0.0"), "{v6}");
    }
}
