//! This process's mount table, from /proc/self/mountinfo.

use std::io;
use std::path::PathBuf;

/// One mount: where it is, and its file-system type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    pub point: PathBuf,
    pub fstype: String,
}

/// Every mount of this process's mount namespace, in the kernel's order.
pub fn mounts() -> io::Result<Vec<Mount>> {
    Ok(parse(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// Where file systems of type `fstype` are mounted, in the kernel's order.
pub fn mount_points(fstype: &str) -> io::Result<Vec<PathBuf>> {
    let mounts = mounts()?.into_iter().filter(|m| m.fstype == fstype);
    Ok(mounts.map(|m| m.point).collect())
}

/// mountinfo lines are `id parent maj:min root mountpoint opts [optional…] - fstype source
/// superopts`; the optional fields vary in number, so the type is the field after the lone
/// `-`.
fn parse(info: &str) -> Vec<Mount> {
    info.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let dash = fields.iter().position(|f| *f == "-")?;
            Some(Mount {
                point: PathBuf::from(unescape(fields.get(4)?)),
                fstype: (*fields.get(dash + 1)?).to_owned(),
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    let mut out = String::new();
    let mut rest = field;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        match rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_mount_of_a_hybrid_layout() {
        let info = "\
25 31 0:23 / /sys rw,nosuid shared:7 - sysfs sysfs rw
36 31 0:31 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
41 36 0:38 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw
42 36 0:39 / /sys/fs/cgroup/systemd rw,relatime shared:11 - cgroup cgroup rw,name=systemd
";
        let found: Vec<(PathBuf, String)> = parse(info)
            .into_iter()
            .map(|m| (m.point, m.fstype))
            .collect();
        let expected = [
            ("/sys", "sysfs"),
            ("/sys/fs/cgroup", "tmpfs"),
            ("/sys/fs/cgroup/unified", "cgroup2"),
            ("/sys/fs/cgroup/systemd", "cgroup"),
        ]
        .map(|(point, fstype)| (PathBuf::from(point), fstype.to_owned()));
        assert_eq!(found, expected);
        assert_eq!(parse("no dash here\n"), []);
    }

    #[test]
    fn unescapes_mountinfo_octal() {
        assert_eq!(unescape(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(unescape(r"/plain"), "/plain");
        assert_eq!(unescape(r"/odd\x"), r"/odd\x");
    }
}
