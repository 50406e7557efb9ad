//! Go's pflag syntax, which every mesh's Go command line has, on a clap command: a flag
//! whose value is named `BOOL` takes an optional `=VALUE` (`--dry-run`,
//! `--dry-run=false`), and every other flag takes the next word as its value even if it
//! starts with `-` (`-t -1`), so that such a value is refused with a message about the
//! value rather than taken for a flag.

use std::ffi::OsString;

use clap::{ArgMatches, Command, FromArgMatches};

/// `cmd` with pflag's syntax on each of its flags (positional arguments keep clap's).
pub fn pflag_syntax(cmd: Command) -> Command {
    cmd.mut_args(|arg| {
        if arg.is_positional() || !arg.get_action().takes_values() {
            return arg;
        }
        if arg.get_value_names() == Some(&["BOOL".into()][..]) {
            arg.num_args(0..=1)
                .require_equals(true)
                .default_missing_value("true")
        } else {
            arg.allow_hyphen_values(true)
        }
    })
}

/// `argv` (`argv[0]` included) parsed by `cmd`, as `A` and the matches it came from (where
/// each value came from: the command line or a default).
pub fn parse<A: FromArgMatches>(
    cmd: Command,
    argv: impl IntoIterator<Item = impl Into<OsString> + Clone>,
) -> Result<(A, ArgMatches), clap::Error> {
    let matches = cmd.try_get_matches_from(argv)?;
    Ok((A::from_arg_matches(&matches)?, matches))
}
