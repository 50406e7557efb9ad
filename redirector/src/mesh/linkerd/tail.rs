//! Editing a proxy-init argv tail. A single-valued flag is overridden by giving it again
//! (the last one wins), but a list flag given again appends; to *replace* a list, every
//! earlier occurrence must go first: [`without_flag`].

use std::collections::BTreeSet;

use super::proxy_init_command;

/// `tail` (argv after argv[0]) with every occurrence of the flag `--long` (`long` is its
/// name without the dashes) removed: `--long=VALUE`, and `--long VALUE` with its value
/// word. The other words are kept in
/// their order. Words after `--` are values, never flags, and are kept.
///
/// `long` is a flag with no short name (the ignore lists are): a short one inside a
/// cluster (`-wr80`) cannot be cut out of its word.
pub(crate) fn without_flag(tail: &[String], long: &str) -> Vec<String> {
    let syntax = FlagSyntax::of_proxy_init();
    let mut kept = Vec::with_capacity(tail.len());
    let mut words = tail.iter();
    while let Some(word) = words.next() {
        if word == "--" {
            kept.push(word.clone());
            kept.extend(words.by_ref().cloned());
            break;
        }
        let value_word = syntax.takes_next_word(word).then(|| words.next()).flatten();
        let name = word
            .strip_prefix("--")
            .map(|rest| rest.split_once('=').map_or(rest, |(name, _)| name));
        if name == Some(long) {
            continue;
        }
        kept.push(word.clone());
        kept.extend(value_word.cloned());
    }
    kept
}

/// Which of proxy-init's flags read their value from the next word, taken from the clap
/// definition itself so that it cannot drift from it.
struct FlagSyntax {
    /// Long names (aliases included) of the flags that take a value but not only as
    /// `=VALUE` (`--ipv6`, `--simulate` and the other booleans need the `=`).
    long: BTreeSet<String>,
    /// Short names of the flags that take a value without `=` (`-p`, `-o`, `-u`, `-g`, `-r`).
    short: BTreeSet<char>,
    /// Short names of the flags that take a value only as `=VALUE` (`-w`).
    short_with_equals: BTreeSet<char>,
}

impl FlagSyntax {
    fn of_proxy_init() -> Self {
        let mut command = proxy_init_command();
        command.build();
        let mut syntax = FlagSyntax {
            long: BTreeSet::new(),
            short: BTreeSet::new(),
            short_with_equals: BTreeSet::new(),
        };
        for arg in command.get_arguments() {
            if !arg.get_action().takes_values() {
                continue;
            }
            let next_word = !arg.is_require_equals_set();
            if let Some(short) = arg.get_short() {
                if next_word {
                    syntax.short.insert(short);
                } else {
                    syntax.short_with_equals.insert(short);
                }
            }
            if next_word {
                let longs = arg.get_long().into_iter();
                let aliases = arg.get_all_aliases().unwrap_or_default();
                syntax.long.extend(longs.chain(aliases).map(str::to_owned));
            }
        }
        syntax
    }

    /// Whether `word`, read as a flag, takes the word after it as its value.
    fn takes_next_word(&self, word: &str) -> bool {
        if let Some(long) = word.strip_prefix("--") {
            return !long.contains('=') && self.long.contains(long);
        }
        let Some(cluster) = word.strip_prefix('-').filter(|c| !c.is_empty()) else {
            return false;
        };
        // `-wp 4143`: flags without a value (`-w` has one only as `-w=VALUE`, which ends
        // the word), then at most one taking the rest of the word or, when nothing is
        // left, the next word.
        for (at, short) in cluster.char_indices() {
            let rest = &cluster[at + short.len_utf8()..];
            if self.short_with_equals.contains(&short) && rest.starts_with('=') {
                return false;
            }
            if self.short.contains(&short) {
                return rest.is_empty();
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &[&str]) -> Vec<String> {
        text.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn every_form_of_the_flag_goes_and_nothing_else() {
        let tail = words(&[
            "--outbound-ports-to-ignore",
            "4567,4568",
            "-p",
            "4143",
            "--outbound-ports-to-ignore=25",
            "--inbound-ports-to-ignore",
            "4190",
            "--outbound-ports-to-ignore",
            "-1",
        ]);
        assert_eq!(
            without_flag(&tail, "outbound-ports-to-ignore"),
            ["-p", "4143", "--inbound-ports-to-ignore", "4190"]
        );
    }

    #[test]
    fn a_value_that_looks_like_the_flag_is_a_value() {
        // `--netns` takes the next word whatever it is; `-o` too, attached or not.
        let tail = words(&[
            "--netns",
            "--subnets-to-ignore",
            "-o",
            "--subnets-to-ignore",
            "-o4140",
            "--subnets-to-ignore",
            "10.0.0.0/8",
            "--ipv6",
            "--subnets-to-ignore=fd00::/8",
        ]);
        assert_eq!(
            without_flag(&tail, "subnets-to-ignore"),
            [
                "--netns",
                "--subnets-to-ignore",
                "-o",
                "--subnets-to-ignore",
                "-o4140",
                "--ipv6"
            ]
        );
    }

    #[test]
    fn boolean_flags_take_no_next_word() {
        let syntax = FlagSyntax::of_proxy_init();
        for flag in ["--ipv6", "--simulate", "--dry-run", "-w", "--use-wait-flag"] {
            assert!(!syntax.takes_next_word(flag), "{flag}");
        }
        for flag in ["-p", "-wp", "--netns", "--inbound-ports-to-ignore", "-r"] {
            assert!(syntax.takes_next_word(flag), "{flag}");
        }
        for word in ["-p4143", "--netns=/x", "4143", "-", "-w=true"] {
            assert!(!syntax.takes_next_word(word), "{word}");
        }
    }

    #[test]
    fn the_syntax_is_clap_s() {
        // Each word list parses, and the flag after the words in question is read as one.
        let env = std::collections::HashMap::<String, String>::new();
        for words in [
            &["-wp", "4143", "-o", "4140"][..],
            &["-w=true", "-p", "4143", "-o", "4140"],
            &["-p4143", "-o", "4140"],
            &["--netns", "--ipv6", "-p", "4143", "-o", "4140"],
        ] {
            let argv = std::iter::once("proxy-init").chain(words.iter().copied());
            let cfg = crate::mesh::linkerd::parse_proxy_init(argv, &env)
                .unwrap_or_else(|err| panic!("{words:?}: {err}"));
            assert_eq!(cfg.capture.inbound_port, 4143, "{words:?}");
            assert_eq!(cfg.capture.outbound_port, 4140, "{words:?}");
        }
    }

    #[test]
    fn words_after_the_end_of_flags_are_kept() {
        let tail = words(&[
            "--subnets-to-ignore=10.0.0.0/8",
            "--",
            "--subnets-to-ignore=x",
        ]);
        assert_eq!(
            without_flag(&tail, "subnets-to-ignore"),
            ["--", "--subnets-to-ignore=x"]
        );
    }

    #[test]
    fn the_replaced_lists_have_no_short_name() {
        let command = proxy_init_command();
        for long in ["outbound-ports-to-ignore", "subnets-to-ignore"] {
            let arg = command
                .get_arguments()
                .find(|a| a.get_long() == Some(long))
                .unwrap_or_else(|| panic!("no --{long}"));
            assert_eq!(arg.get_short(), None, "--{long}");
        }
    }
}
