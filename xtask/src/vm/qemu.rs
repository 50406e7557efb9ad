//! Booting a kernel and its initramfs in QEMU: KVM when a probe boot works, else TCG.

use std::{
    fs,
    io::{BufRead as _, BufReader, Write as _},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use super::kernels::Kernel;
use crate::arch::Arch;

/// Overall time limit of one kernel's test run: CI's 6.1 job, with 18 suites then, took
/// 38 minutes under TCG beside another guest and the host's own test run.
pub(crate) const RUN_TIMEOUT: Duration = Duration::from_secs(70 * 60);
/// Time limit of one test binary in the guest: the longest, istio's conformance on 5.10,
/// takes about 15 minutes under TCG. One that hangs is killed after the guest's processes
/// are listed, and the run goes on with the next.
pub(crate) const SUITE_TIMEOUT: Duration = Duration::from_secs(25 * 60);
/// A KVM probe boot that does not power off within this is taken as "KVM does not work".
pub(crate) const KVM_PROBE_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

pub(crate) struct Boot {
    pub(crate) log: String,
    pub(crate) boot_time: Option<Duration>,
    pub(crate) wall: Duration,
    pub(crate) timed_out: bool,
}

/// Boots QEMU, copying its serial console to `log` (and echoing `vm:` lines), until it exits
/// or `timeout` passes (then it is killed).
pub(crate) fn boot(
    kernel: &Kernel,
    initrd: &Path,
    accel: Accel,
    append_extra: &str,
    log: &Path,
    timeout: Duration,
    echo: bool,
) -> Result<Boot> {
    let mut cmd = Command::new(qemu_system(kernel.arch));
    match accel {
        Accel::Kvm => cmd.args(["-enable-kvm", "-cpu", "host"]),
        // pauth-impdef: pointer authentication by QEMU's own cheap hash rather than the
        // architected one, which costs TCG a large share of its time.
        Accel::Tcg if kernel.arch == Arch::Arm64 => {
            cmd.args(["-accel", "tcg", "-cpu", "max,pauth-impdef=on"])
        }
        Accel::Tcg => cmd.args(["-accel", "tcg", "-cpu", "max"]),
    };
    let (machine, console) = match kernel.arch {
        Arch::Amd64 => ("q35", "ttyS0"),
        Arch::Arm64 => ("virt", "ttyAMA0"),
    };
    cmd.args([
        "-machine",
        machine,
        "-m",
        "2048",
        "-smp",
        "2",
        "-nic",
        "none",
        "-display",
        "none",
        "-monitor",
        "none",
        "-serial",
        "stdio",
        "-no-reboot",
    ])
    .arg("-kernel")
    .arg(&kernel.image)
    .arg("-initrd")
    .arg(initrd)
    .arg("-append")
    .arg(format!("console={console} panic=-1 quiet {append_extra}"))
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", qemu_system(kernel.arch)))?;
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let mut file = fs::File::create(log)?;
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, String)>();
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).split(b'\n').map_while(|l| l.ok()) {
            let line = String::from_utf8_lossy(&line)
                .trim_end_matches('\r')
                .to_string();
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
            if tx2.send((Instant::now(), format!("qemu: {line}"))).is_err() {
                break;
            }
        }
    });
    let mut text = String::new();
    let mut boot_time = None;
    let mut timed_out = false;
    let deadline = start + timeout;
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok((at, line)) => {
                if boot_time.is_none() && line.starts_with("vm: init") {
                    boot_time = Some(at - start);
                }
                if echo && (line.starts_with("vm:") || line.starts_with("qemu:")) {
                    eprintln!("  {line}");
                }
                writeln!(file, "{line}")?;
                text.push_str(&line);
                text.push('\n');
                continue;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                child.wait()?;
                break;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        if Instant::now() > deadline {
            timed_out = true;
            let _ = child.kill(); // our own QEMU, by its pid
            let _ = child.wait();
            // Drain what is left.
            while let Ok((_, line)) = rx.recv_timeout(Duration::from_millis(500)) {
                writeln!(file, "{line}")?;
                text.push_str(&line);
                text.push('\n');
            }
            break;
        }
    }
    Ok(Boot {
        log: text,
        boot_time,
        wall: start.elapsed(),
        timed_out,
    })
}

/// The QEMU that emulates a machine of `arch`.
pub(crate) fn qemu_system(arch: Arch) -> &'static str {
    match arch {
        Arch::Amd64 => "qemu-system-x86_64",
        Arch::Arm64 => "qemu-system-aarch64",
    }
}

/// Whether this kernel boots to /init under KVM within [`KVM_PROBE_TIMEOUT`]; else why not.
pub(crate) fn kvm_probe(kernel: &Kernel, initrd: &Path, log: &Path) -> Result<(), String> {
    if !kernel.arch.is_host() {
        return Err(format!("an {} guest on this machine", kernel.arch.name()));
    }
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map_err(|e| format!("/dev/kvm: {e}"))?;
    let b = boot(
        kernel,
        initrd,
        Accel::Kvm,
        "vm.probe=1",
        log,
        KVM_PROBE_TIMEOUT,
        false,
    )
    .map_err(|e| e.to_string())?;
    if b.log.contains("vm: probe ok") {
        return Ok(());
    }
    if b.timed_out {
        return Err(format!(
            "no /init within {}s (hangs)",
            KVM_PROBE_TIMEOUT.as_secs()
        ));
    }
    Err(b
        .log
        .lines()
        .rfind(|l| l.starts_with("qemu:"))
        .unwrap_or("QEMU exited without reaching /init")
        .to_string())
}
