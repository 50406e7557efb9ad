//! `cargo xtask vm`: the privileged integration tests inside QEMU, on other kernels.
//!
//! For each kernel: fetch Debian's kernel package (`apt-get download` + `dpkg -x`, cached under
//! `target/vm/kernels/`), build an initramfs (busybox, the host-built test binaries, the tools
//! they call with their shared libraries, the kernel modules they need, and a busybox-sh
//! `/init`), boot it in QEMU (KVM if a probe boot finishes in time, else TCG), and read the
//! libtest summaries from the serial log. Prints one verdict table at the end.

mod initramfs;
mod kernels;
mod qemu;
mod userland;

use std::{fs, path::PathBuf, process::Stdio, time::Duration};

use anyhow::{bail, Result};

use self::{initramfs::*, kernels::*, qemu::*};
use crate::arch::Arch;
use crate::results::{parse_results, Counts};
use crate::workspace::{cargo, ensure_tool, output, status, target_dir, workspace_root};

pub(crate) fn vm_dir() -> PathBuf {
    target_dir().join("vm")
}

/// Where the debug build for `arch` lives: the host's where plain cargo puts it, a foreign
/// architecture's under its target triple.
pub(crate) fn debug_dir(arch: Arch) -> PathBuf {
    if arch.is_host() {
        target_dir().join("debug")
    } else {
        target_dir().join(arch.triple()).join("debug")
    }
}

/// Builds redirector, probe and the integration test binaries for `arch` — only the
/// `suites` named, when they are all integration tests in tests/tests — and returns the
/// test executables.
pub(crate) fn build_tests(arch: Arch, suites: &[String]) -> Result<Vec<(String, PathBuf)>> {
    let cargo_for = |args: &[&str]| {
        let mut cmd = cargo();
        cmd.args(args);
        if !arch.is_host() {
            cmd.args(["--target", arch.triple()]);
            arch.configure_cargo(&mut cmd, "");
        }
        cmd
    };
    status(cargo_for(&[
        "build",
        "-p",
        "redirector",
        "-p",
        "redirector-tests",
        "--bins",
    ]))?;
    let mut cmd = cargo_for(&[
        "test",
        "-p",
        "redirector-tests",
        "--no-run",
        "--message-format=json",
    ]);
    let tests_dir = workspace_root().join("tests/tests");
    if !suites.is_empty()
        && suites
            .iter()
            .all(|s| tests_dir.join(format!("{s}.rs")).is_file())
    {
        for suite in suites {
            cmd.args(["--test", suite]);
        }
    }
    cmd.stderr(Stdio::inherit());
    let mut tests = Vec::new();
    for line in output(cmd)?.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] == "compiler-artifact" && msg["profile"]["test"] == true {
            if let Some(exe) = msg["executable"].as_str() {
                let kind = msg["target"]["kind"][0].as_str().unwrap_or("test");
                let target = msg["target"]["name"].as_str().unwrap_or("test");
                // Integration tests by their name, unit tests of a lib/bin as `<name>.<kind>`.
                let name = if kind == "test" {
                    target.to_string()
                } else {
                    format!("{target}.{kind}")
                };
                tests.push((name, PathBuf::from(exe)));
            }
        }
    }
    if tests.is_empty() {
        bail!("cargo test --no-run reported no test executables");
    }
    Ok(tests)
}

struct Row {
    kernel: String,
    arch: Arch,
    boot: String,
    accel: &'static str,
    counts: Counts,
    wall: Duration,
    verdict: String,
}

pub fn run(arch: Arch, specs: &[String], suites: &[String], filter: &[String]) -> Result<()> {
    let qemu_package = match arch {
        Arch::Amd64 => "qemu-system-x86",
        Arch::Arm64 => "qemu-system-arm",
    };
    ensure_tool(qemu_system(arch), qemu_package)?;
    ensure_tool("cpio", "cpio")?;
    ensure_tool("busybox", "busybox-static")?;
    let specs: Vec<String> = if specs.is_empty() {
        vec!["6.1".into()]
    } else {
        specs.to_vec()
    };
    let mut kernels = Vec::new();
    for s in &specs {
        kernels.extend(resolve(s, arch)?);
    }
    let mut tests = build_tests(arch, suites)?;
    if !suites.is_empty() {
        if let Some(unknown) = suites.iter().find(|s| !tests.iter().any(|(t, _)| t == *s)) {
            let names: Vec<&str> = tests.iter().map(|(t, _)| t.as_str()).collect();
            bail!(
                "--suite {unknown}: no such test binary (there are {})",
                names.join(", ")
            );
        }
        tests.retain(|(t, _)| suites.contains(t));
    }
    eprintln!("xtask vm: {} test binaries", tests.len());
    let mut rows = Vec::new();
    for (i, kernel) in kernels.iter().enumerate() {
        let name = guest_name(i, &kernel.label, crate::run::forced_fallbacks().as_deref());
        eprintln!("xtask vm: [{}] building the initramfs", kernel.label);
        let initrd = build_initramfs(&name, kernel, &tests, filter)?;
        let logs = vm_dir().join("logs");
        fs::create_dir_all(&logs)?;
        let accel = match kvm_probe(kernel, &initrd, &logs.join(format!("{name}-kvm-probe.log"))) {
            Ok(()) => Accel::Kvm,
            Err(why) => {
                eprintln!(
                    "xtask vm: [{}] KVM not usable, using TCG: {why}",
                    kernel.label
                );
                Accel::Tcg
            }
        };
        let log = logs.join(format!("{name}.log"));
        eprintln!(
            "xtask vm: [{}] booting ({}), log {}",
            kernel.label,
            accel.name(),
            log.display()
        );
        let b = boot(kernel, &initrd, accel, "", &log, RUN_TIMEOUT, true)?;
        let counts = parse_results(&b.log);
        // The guest's log stays on this machine: a failure's own output is printed here,
        // so that a CI log says why.
        for block in failure_output(&b.log)
            .into_iter()
            .chain(unfinished_output(&b.log))
        {
            eprintln!("xtask vm: [{}] {block}", kernel.label);
        }
        let verdict = if b.timed_out {
            "FAIL (timeout)".to_string()
        } else if b.log.contains("vm: PASS") {
            "PASS".to_string()
        } else if b.log.contains("vm: FAIL") {
            "FAIL".to_string()
        } else {
            "FAIL (no verdict; see log)".to_string()
        };
        let forced = crate::run::forced_fallbacks()
            .map(|f| format!(" (fallbacks forced: {f})"))
            .unwrap_or_default();
        rows.push(Row {
            kernel: format!("{}{forced}", kernel.label),
            arch,
            boot: b
                .boot_time
                .map_or("-".into(), |d| format!("{:.1}s", d.as_secs_f64())),
            accel: accel.name(),
            counts,
            wall: b.wall,
            verdict,
        });
    }
    println!();
    println!(
        "| kernel | arch | boot time | accel | passed | failed | skipped | wall time | verdict |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.0}s | {} |",
            r.kernel,
            r.arch.name(),
            r.boot,
            r.accel,
            r.counts.passed,
            r.counts.failed,
            r.counts.skipped(),
            r.wall.as_secs_f64(),
            r.verdict
        );
    }
    let mut total = Counts::default();
    for r in &mut rows {
        if r.counts.ignored > 0 {
            println!("{}: {} tests #[ignore]d", r.kernel, r.counts.ignored);
        }
        for note in &r.counts.skip_notes {
            println!("{}: {note}", r.kernel);
        }
        let mut counts = std::mem::take(&mut r.counts);
        for name in counts.failed_tests.iter_mut().chain(&mut counts.unfinished) {
            *name = format!("{} {name}", r.kernel);
        }
        if r.verdict != "PASS" && counts.failed == 0 && counts.unfinished.is_empty() {
            counts
                .unfinished
                .push(format!("{}: the run ({})", r.kernel, r.verdict));
        }
        total.add(counts);
    }
    println!("{}", total.summary("vm"));
    let failed: Vec<&str> = rows
        .iter()
        .filter(|r| r.verdict != "PASS")
        .map(|r| r.kernel.as_str())
        .collect();
    if !failed.is_empty() {
        bail!("failed on {}", failed.join(", "));
    }
    Ok(())
}

/// The guest's directory and log name: one per kernel and per forced fallback set, so that
/// runs for different kernels, or the same kernel with and without fallbacks forced, can
/// run side by side.
fn guest_name(index: usize, label: &str, forced: Option<&str>) -> String {
    let kernel = label
        .rsplit(['(', '/'])
        .next()
        .unwrap_or("kernel")
        .trim_end_matches(')');
    let name = match forced {
        Some(f) => format!("{index}-{kernel}-fallbacks-{f}"),
        None => format!("{index}-{kernel}"),
    };
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || ".-_+".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Each failed test's output as the test harness prints it (`---- name stdout ----` up to
/// the next such block or the `failures:` list). A long one keeps its first lines (the
/// assertion) and its last (where a log shows what went wrong), with a count between.
fn failure_output(log: &str) -> Vec<String> {
    const HEAD: usize = 15;
    const TAIL: usize = 45;
    let mut blocks: Vec<Vec<&str>> = Vec::new();
    let mut open = false;
    for line in log.lines() {
        let line = line.trim_end_matches('\r');
        if line.starts_with("---- ") && line.ends_with(" ----") {
            blocks.push(vec![line]);
            open = true;
        } else if line == "failures:" || line.starts_with("test result:") {
            open = false;
        } else if open {
            if let Some(block) = blocks.last_mut() {
                block.push(line);
            }
        }
    }
    blocks
        .into_iter()
        .map(|b| {
            if b.len() <= HEAD + TAIL {
                return b.join("\n");
            }
            let elided = format!("[… {} lines …]", b.len() - HEAD - TAIL);
            let kept = b[..HEAD].iter().copied();
            let kept = kept
                .chain([elided.as_str()])
                .chain(b[b.len() - TAIL..].iter().copied());
            kept.collect::<Vec<_>>().join("\n")
        })
        .collect()
}

/// The last 60 lines of each test binary that ended without libtest's result line (hung
/// and killed by the guest's watchdog, or cut off by the run's time limit): the test it
/// was in, and the guest's processes where the watchdog listed them.
fn unfinished_output(log: &str) -> Vec<String> {
    let mut sections: Vec<(&str, Vec<&str>, bool)> = Vec::new();
    for line in log.lines() {
        let line = line.trim_end_matches('\r');
        if let Some(name) = line.strip_prefix("vm: BEGIN ") {
            sections.push((name, Vec::new(), false));
        } else if let Some((_, lines, finished)) = sections.last_mut() {
            if line.contains("test result: ") {
                *finished = true;
            }
            lines.push(line);
        }
    }
    sections
        .into_iter()
        .filter(|(_, _, finished)| !finished)
        .map(|(name, lines, _)| {
            let tail = &lines[lines.len().saturating_sub(60)..];
            format!(
                "{name} ended without a result; its last lines:\n{}",
                tail.join("\n")
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_tests_output_is_found_in_the_guests_log() {
        let log = "running 2 tests\ntest a ... ok\ntest b ... FAILED\n\nfailures:\n\n\
                   ---- b stdout ----\nthread 'b' panicked at x.rs:1:2:\nwhy\n\n\
                   failures:\n    b\n\ntest result: FAILED. 1 passed; 1 failed\n";
        assert_eq!(
            failure_output(log),
            vec!["---- b stdout ----\nthread 'b' panicked at x.rs:1:2:\nwhy\n".to_string()]
        );
        assert!(failure_output("test a ... ok\n").is_empty());
    }

    #[test]
    fn a_long_failure_keeps_its_first_and_last_lines() {
        let body: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let log = format!("---- b stdout ----\n{body}failures:\n    b\n");
        let shown = failure_output(&log).remove(0);
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(lines.len(), 15 + 1 + 45);
        assert_eq!(lines[..2], ["---- b stdout ----", "line 0"]);
        assert_eq!(lines[14..17], ["line 13", "[… 41 lines …]", "line 55"]);
        assert_eq!(lines[60], "line 99");
    }

    #[test]
    fn a_binary_without_a_result_is_shown_with_its_last_lines() {
        let log = "vm: BEGIN a\ntest x ... ok\ntest result: ok. 1 passed\nvm: END a rc=0\n\
                   vm: BEGIN b\ntest y ... ok\ntest z ... \nvm: TIMEOUT b after 1500s\n";
        assert_eq!(
            unfinished_output(log),
            vec![
                "b ended without a result; its last lines:\ntest y ... ok\ntest z ... \n\
                  vm: TIMEOUT b after 1500s"
                    .to_string()
            ]
        );
    }

    #[test]
    fn a_run_with_fallbacks_forced_has_a_guest_of_its_own() {
        let plain = guest_name(0, "6.1 (linux-image-6.1.0-56-amd64)", None);
        assert_eq!(plain, "0-linux-image-6.1.0-56-amd64");
        assert_eq!(
            guest_name(0, "6.1 (linux-image-6.1.0-56-amd64)", Some("all")),
            "0-linux-image-6.1.0-56-amd64-fallbacks-all"
        );
        assert_eq!(
            guest_name(1, "/boot/vmlinuz 6", Some("sk-lookup,x")),
            "1-vmlinuz_6-fallbacks-sk-lookup_x"
        );
    }

    #[test]
    fn module_names_and_versions() {
        assert_eq!(module_name("kernel/drivers/net/veth.ko.xz"), "veth");
        assert_eq!(module_name("kernel/net/x/nf-nat.ko"), "nf_nat");
        assert!(
            version_key("linux-image-6.1.0-56-amd64") > version_key("linux-image-6.1.0-9-amd64")
        );
    }
}
