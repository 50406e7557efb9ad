//! Generated API requests (proptest): any line decodes to a request or is refused without
//! a panic, and an `add` with generated flags is either parsed or refused with the
//! message naming the flag's value, before anything is applied.

use proptest::prelude::*;

use crate::api::Request;
use crate::mesh::{pod_spec, PodFlags};

const CASES: u32 = 2000;

/// istio-iptables' value flags, and the two the daemon refuses.
fn flags() -> Vec<&'static str> {
    let mut flags = crate::mesh::istio::proptests::VALUE_FLAGS.to_vec();
    flags.extend(["--cgroup", "--network-namespace"]);
    flags
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn any_line_decodes_or_is_refused(line in prop_oneof![
        "\\PC{0,80}",
        "\\{\"op\":\"(add|del|list|check|x)\"(,\"[a-z]{1,7}\":(\"[^\"]{0,12}\"|[0-9]{1,4}|\\[\\]|null))*\\}",
    ]) {
        let _ = serde_json::from_str::<Request>(&line);
    }

    #[test]
    fn add_flags_are_parsed_or_refused_by_value(
        pairs in proptest::collection::vec(
            (proptest::sample::select(flags()), "[0-9a-z*,./:-]{0,16}"), 0..5)
    ) {
        let args: Vec<String> = pairs.iter().map(|(f, v)| format!("{f}={v}")).collect();
        match pod_spec(&PodFlags::istio(args)) {
            Ok(_) => {}
            Err(err) => { let msg = err.to_string(); prop_assert!(
                msg.contains("is not accepted by the daemon")
                    // clap names a flag by its long form.
                    || msg.contains("'--")
                    || pairs.iter().any(|(f, v)| msg.contains(f) || (!v.is_empty() && msg.contains(v.as_str()))),
                "{msg} names none of {pairs:?}"
            ) }
        }
    }
}
