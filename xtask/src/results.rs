//! libtest's results, read from a test run's output (`cargo test`'s, or a VM guest's
//! serial log): counts, the names of the failed tests, and the test binaries that ended
//! without a summary (a crash, a kill).

#[derive(Default)]
pub(crate) struct Counts {
    pub(crate) passed: u64,
    pub(crate) failed: u64,
    pub(crate) ignored: u64,
    /// Tests that passed but skipped their checks at run time (`note: skipping ...`).
    pub(crate) skip_notes: Vec<String>,
    /// `binary: test` for each failed test.
    pub(crate) failed_tests: Vec<String>,
    /// Test binaries that began but printed no `test result:` line.
    pub(crate) unfinished: Vec<String>,
}

impl Counts {
    pub(crate) fn skipped(&self) -> u64 {
        self.ignored + self.skip_notes.len() as u64
    }

    pub(crate) fn add(&mut self, other: Counts) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.ignored += other.ignored;
        self.skip_notes.extend(other.skip_notes);
        self.failed_tests.extend(other.failed_tests);
        self.unfinished.extend(other.unfinished);
    }

    /// These counts with `tag` after each failed test's and unfinished binary's name.
    pub(crate) fn tagged(mut self, tag: &str) -> Counts {
        for name in self.failed_tests.iter_mut().chain(&mut self.unfinished) {
            name.push_str(&format!(" ({tag})"));
        }
        self
    }

    /// The closing lines: each failed test or unfinished binary, then
    /// `label: N passed, N failed, N skipped` (an unfinished binary counts as failed).
    pub(crate) fn summary(&self, label: &str) -> String {
        let mut s = String::new();
        for name in &self.failed_tests {
            s.push_str(&format!("{label}: FAILED {name}\n"));
        }
        for name in &self.unfinished {
            s.push_str(&format!(
                "{label}: FAILED {name} (ended without a test result)\n"
            ));
        }
        s.push_str(&format!(
            "{label}: {} passed, {} failed, {} skipped",
            self.passed,
            self.failed + self.unfinished.len() as u64,
            self.skipped()
        ));
        s
    }
}

/// A test binary's start: cargo's `Running tests/dns.rs (target/debug/deps/dns-1f2e…)`,
/// `Doc-tests redirector`, or the VM guest's `vm: BEGIN dns`.
fn binary_begins(line: &str) -> Option<String> {
    let line = line.trim();
    if let Some(name) = line.strip_prefix("vm: BEGIN ") {
        return Some(name.to_string());
    }
    if let Some(krate) = line.strip_prefix("Doc-tests ") {
        return Some(format!("{krate} (doc)"));
    }
    let path = line.strip_prefix("Running ")?.rsplit_once('(')?.1;
    let file = path.trim_end_matches(')').rsplit('/').next()?;
    Some(
        file.rsplit_once('-')
            .map_or(file, |(name, _hash)| name)
            .to_string(),
    )
}

/// Sums libtest's `test result: ok. 3 passed; 0 failed; 1 ignored; ...` lines and names
/// the failed tests from the `failures:` list before each.
pub(crate) fn parse_results(log: &str) -> Counts {
    let mut c = Counts::default();
    // The binary in progress and whether it printed its result.
    let mut binary: Option<(String, bool)> = None;
    // The names under the last `failures:` line, until a `---- name stdout ----` block.
    let mut listing: Option<Vec<String>> = None;
    let close = |binary: Option<(String, bool)>, c: &mut Counts| {
        if let Some((name, false)) = binary {
            c.unfinished.push(name);
        }
    };
    for line in log.lines() {
        if let Some(note) = line.split("note: skipping").nth(1) {
            c.skip_notes.push(format!("skipping{note}"));
        }
        if let Some(name) = binary_begins(line) {
            close(binary.take(), &mut c);
            binary = Some((name, false));
            listing = None;
            continue;
        }
        if line == "failures:" {
            listing = Some(Vec::new());
        } else if line.starts_with("---- ") {
            listing = None;
        } else if let (Some(names), Some(name)) = (listing.as_mut(), line.strip_prefix("    ")) {
            names.push(name.trim().to_string());
        }
        let Some(rest) = line.split("test result: ").nth(1) else {
            continue;
        };
        let label = match binary.as_mut() {
            Some((name, finished)) => {
                *finished = true;
                name.clone()
            }
            None => "?".to_string(),
        };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let n: u64 = n.parse().unwrap_or(0);
            match what {
                "passed" => c.passed += n,
                "failed" => c.failed += n,
                "ignored" => c.ignored += n,
                _ => {}
            }
        }
        for name in listing.take().unwrap_or_default() {
            c.failed_tests.push(format!("{label}: {name}"));
        }
    }
    close(binary, &mut c);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_libtest_results() {
        let log = "test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 2 filtered out; finished in 1.00s\n\
                   test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out\n";
        let c = parse_results(log);
        assert_eq!((c.passed, c.failed, c.ignored), (4, 2, 1));
    }

    #[test]
    fn names_failed_tests_and_unfinished_binaries() {
        let log = "\
     Running unittests src/main.rs (target/debug/deps/xtask-0f1e2d3c)
running 2 tests
test a ... ok
test b ... note: skipping b: podman not installed
ok

test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out
     Running tests/metrics.rs (target/debug/deps/metrics-a1b2c3d4)
running 3 tests
test adds ... FAILED
test scrapes ... FAILED
test probes ... ok

failures:

---- adds stdout ----
failures:
    not a name
thread 'adds' panicked

---- scrapes stdout ----
boom

failures:
    adds
    scrapes

test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out
     Running tests/outbound.rs (target/debug/deps/outbound-99aa)
running 1 test
test v4 ... error: test failed, to rerun pass `--test outbound`
vm: BEGIN dns
running 1 test
test q ... ok

test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out
   Doc-tests redirector
";
        let c = parse_results(log);
        assert_eq!((c.passed, c.failed), (4, 2));
        assert_eq!(c.failed_tests, ["metrics: adds", "metrics: scrapes"]);
        assert_eq!(c.unfinished, ["outbound", "redirector (doc)"]);
        assert_eq!(c.skip_notes.len(), 1);
        assert_eq!(
            c.summary("tests").lines().last(),
            Some("tests: 4 passed, 4 failed, 1 skipped")
        );
    }
}
