//! CPU time of the whole machine (every core, user + system + irq + softirq), from
//! /proc/stat, so that work done in softirq on behalf of a connection is counted too.

/// Busy time of all cores so far, in microseconds.
pub fn busy_us() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").expect("reading /proc/stat");
    let line = stat.lines().next().expect("/proc/stat has a cpu line");
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal guest guest_nice; guest time is
    // already inside user.
    let busy: u64 = fields
        .iter()
        .take(8)
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, v)| v)
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    busy as f64 * 1e6 / hz
}
