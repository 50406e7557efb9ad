//! `bench`: redirector against istio's iptables rules, side by side in one run. Run by
//! `cargo xtask bench`, which installs wrk and nginx and builds the release binaries first.
//!
//! ```text
//! bench [--quick] [--scale] [--out DIR] [--only datapath|setup|churn|scale] [--modes NAME,...]
//! ```
//! `--scale` runs the churn of init-container pods (set up and deleted without a cleanup,
//! 10 alive at a time) over 10,000 pods instead of 1,000, and (with the setup part)
//! 10,000 pods through the daemon's API and out again ([`scale`]); `--only scale` runs
//! that part alone.
//! `--modes` measures only those data-path modes (e.g. to compare two redirector builds
//! through `REDIRECTOR_BIN`, one without `redirector trace`).
//! Prints a Markdown report; writes `bench.json` and `bench.svg` to DIR.
//!
//! `bench soak [--minutes N] [--pods N] …` runs the daemon's soak instead ([`soak`]).

mod ambient;
mod cpu;
mod datapath;
mod memory;
mod plot;
mod report;
mod scale;
mod scrapes;
mod sequence;
mod setup;
mod soak;
mod stats;
mod timed;
mod wrk;

use std::path::PathBuf;
use std::process::ExitCode;

struct Options {
    quick: bool,
    scale: bool,
    out: PathBuf,
    datapath: bool,
    setup: bool,
    /// The per-pod setup measures besides `--scale`'s (`--only scale` leaves them out).
    setup_sequences: bool,
    churn: bool,
    modes: Vec<datapath::Mode>,
}

fn parse_args() -> Result<Options, String> {
    let mut o = Options {
        quick: false,
        scale: false,
        out: PathBuf::from("target/bench"),
        datapath: true,
        setup: true,
        setup_sequences: true,
        churn: true,
        modes: datapath::Mode::ALL.to_vec(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => o.quick = true,
            "--scale" => o.scale = true,
            "--out" => o.out = args.next().ok_or("--out needs a directory")?.into(),
            "--only" => match args.next().as_deref() {
                Some("datapath") => (o.setup, o.churn) = (false, false),
                Some("setup") => o.datapath = false,
                Some("churn") => (o.datapath, o.setup) = (false, false),
                Some("scale") => {
                    (o.datapath, o.churn, o.setup_sequences) = (false, false, false);
                    o.scale = true;
                }
                other => {
                    return Err(format!(
                        "--only {other:?}: use datapath, setup, churn or scale"
                    ))
                }
            },
            "--modes" => {
                let list = args.next().ok_or("--modes needs a list")?;
                o.modes = list
                    .split(',')
                    .map(|name| {
                        datapath::Mode::ALL
                            .into_iter()
                            .find(|m| m.name() == name)
                            .ok_or_else(|| format!("--modes: no mode {name:?}"))
                    })
                    .collect::<Result<_, _>>()?;
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(o)
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    format!(
        "Measured {date} on {cpus} vCPU ({model}), Linux {}",
        release.trim()
    )
}

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("soak") {
        return soak_main();
    }
    let opts = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "bench: {e}\nusage: bench [--quick] [--scale] [--out DIR] [--only datapath|setup|churn|scale] [--modes NAME,...]"
            );
            return ExitCode::from(64);
        }
    };
    if !redirector_tests::require_root() {
        return ExitCode::from(1);
    }
    let (rounds, seconds, samples, pods) = if opts.quick {
        (2, 2, 10, 100)
    } else {
        (5, 3, 30, 1000)
    };
    let machine = machine();
    let dp = if opts.datapath {
        datapath::run(rounds, seconds, &opts.modes)
    } else {
        datapath::DataPath::default()
    };
    let mut setup = if opts.setup && opts.setup_sequences {
        setup::run(samples, pods)
    } else {
        setup::Setup::default()
    };
    if opts.setup && opts.setup_sequences {
        setup.scrapes = Some(scrapes::run(100, rounds as usize));
    }
    if opts.setup && opts.scale {
        // Past the shipped capacity: the daemon sizes the node for them (`--max-pods`).
        setup.scale = Some(scale::run(10_000));
    }
    if opts.churn {
        setup.churn = setup::churn_sequence(match (opts.scale, opts.quick) {
            (true, _) => 10_000,
            (false, true) => 200,
            (false, false) => 1_000,
        });
    }
    let text = format!(
        "{}\n{}",
        report::markdown(&dp, &setup, &machine),
        report::targets(&dp, &setup)
    );
    println!("{text}");
    if let Err(e) = std::fs::create_dir_all(&opts.out) {
        eprintln!("bench: creating {}: {e}", opts.out.display());
        return ExitCode::from(1);
    }
    let json = serde_json::json!({
        "machine": machine,
        "datapath": dp,
        "setup": setup,
    });
    let json_path = opts.out.join("bench.json");
    let md_path = opts.out.join("bench.md");
    let svg_path = opts.out.join("bench.svg");
    let written = std::fs::write(&json_path, serde_json::to_string_pretty(&json).unwrap())
        .and_then(|()| std::fs::write(&md_path, &text));
    if let Err(e) = written {
        eprintln!("bench: writing {}: {e}", opts.out.display());
        return ExitCode::from(1);
    }
    if !dp.samples.is_empty() {
        if let Err(e) = plot::draw(&dp, &svg_path) {
            eprintln!("bench: drawing {}: {e}", svg_path.display());
            return ExitCode::from(1);
        }
    }
    eprintln!(
        "bench: wrote {}, {} and {}",
        json_path.display(),
        md_path.display(),
        svg_path.display()
    );
    ExitCode::SUCCESS
}

/// `bench soak …`: the daemon under pod churn ([`soak`]); exits 1 when the verdict fails.
fn soak_main() -> ExitCode {
    let opts = match soak::parse_args(std::env::args().skip(2)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("bench soak: {e}");
            return ExitCode::from(64);
        }
    };
    if !redirector_tests::require_root() {
        return ExitCode::from(1);
    }
    if soak::run(&opts) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
