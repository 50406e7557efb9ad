//! libtest's summaries, read from the guest's serial log.

#[derive(Default)]
pub(crate) struct Counts {
    pub(crate) passed: u64,
    pub(crate) failed: u64,
    pub(crate) ignored: u64,
    /// Tests that passed but skipped their checks at run time (`note: skipping ...`).
    pub(crate) skip_notes: Vec<String>,
}

/// Sums libtest's `test result: ok. 3 passed; 0 failed; 1 ignored; ...` lines.
pub(crate) fn parse_results(log: &str) -> Counts {
    let mut c = Counts::default();
    for line in log.lines() {
        if let Some(note) = line.split("note: skipping").nth(1) {
            c.skip_notes.push(format!("skipping{note}"));
        }
        let Some(rest) = line.split("test result: ").nth(1) else {
            continue;
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
    }
    c
}
