//! istio-cni's in-pod rules for an ambient pod, the reference the ambient suite compares
//! redirector with: iptables (restore) rules written from istio-cni's rule set, with or
//! without DNS capture, and its policy route, which is `redirector::sys::reply_route`'s.
//!
//! ztunnel's sockets carry mark 0x539 (1337). In `mangle`, a connection that comes from
//! one is connmarked 0x111, and packets of a connmarked connection take the mark back on
//! their way out: the app's replies to ztunnel's spoofed-source upstreams are routed by
//! the mark to the table that delivers locally. In `nat`, inbound TCP not to loopback, not
//! to HBONE (15008) and not from ztunnel goes to 15006; outbound TCP not to loopback, not
//! over `lo` and not from ztunnel goes to 15001; kubelet's probes (SNATed on the host to a
//! link-local address) pass. With DNS capture, before the outbound rules: UDP 53 not over
//! `lo` and TCP 53 not to loopback, neither from ztunnel, go to ztunnel's DNS proxy
//! (15053); and `raw` keeps ztunnel's own DNS upstream traffic in a conntrack zone of its
//! own.

use crate::{iptables::apply_golden, NetNs};

/// Whether the pod's DNS goes to ztunnel's DNS proxy (`ambient.istio.io/dns-capture`, else
/// the node's default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DnsCapture {
    Off,
    On,
}

/// The rules up to nat's pass of the probes' replies, for IPv4; IPv6 takes the same with
/// its own loopback and probe address.
const RULES_V4_HEAD: &str = "\
*mangle
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_PRERT - [0:0]
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_PRERT - [0:0]
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -d PROBE -p tcp -m tcp -j ACCEPT
";

/// With DNS capture, right after the pass of the probes' replies.
const DNS_RULES: &str = "\
-A ISTIO_OUTPUT ! -o lo -p udp -m mark ! --mark 0x539/0xfff -m udp --dport 53 -j REDIRECT --to-ports 15053
-A ISTIO_OUTPUT ! -d LOOPBACK -p tcp -m tcp --dport 53 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15053
";

/// The rest of the rules.
const RULES_V4_TAIL: &str = "\
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d LOOPBACK -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d LOOPBACK -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
-A ISTIO_PRERT -s PROBE -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d LOOPBACK -p tcp -m tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006
COMMIT
";

/// The source kubelet's probes are SNATed to on the host.
pub const PROBE_V4: &str = "169.254.7.127/32";
pub const PROBE_V6: &str = "fd16:9254:7127:1337:ffff:ffff:ffff:ffff/128";

/// With DNS capture: ztunnel's own DNS queries (marked) and the DNS replies coming in (not
/// marked) are tracked in conntrack zone 1, apart from the pod's redirected queries.
const DNS_RAW: &str = "\
*raw
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_PRERT - [0:0]
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -p udp -m mark --mark 0x539/0xfff -m udp --dport 53 -j CT --zone 1
-A ISTIO_PRERT -p udp -m mark ! --mark 0x539/0xfff -m udp --sport 53 -j CT --zone 1
COMMIT
";

/// The rules for IPv4 and for IPv6, DNS capture off.
pub fn rules() -> (String, String) {
    rules_with(DnsCapture::Off)
}

/// The rules for IPv4 and for IPv6, with DNS capture `dns`.
pub fn rules_with(dns: DnsCapture) -> (String, String) {
    let template = match dns {
        DnsCapture::Off => format!("{RULES_V4_HEAD}{RULES_V4_TAIL}"),
        DnsCapture::On => format!("{RULES_V4_HEAD}{DNS_RULES}{RULES_V4_TAIL}{DNS_RAW}"),
    };
    let v4 = template
        .replace("PROBE", PROBE_V4)
        .replace("LOOPBACK", "127.0.0.1/32");
    let v6 = template
        .replace("PROBE", PROBE_V6)
        .replace("LOOPBACK", "::1/128");
    (v4, v6)
}

/// Applies the rules (DNS capture off) and the policy route inside `netns`, as istio-cni's
/// node agent does for an enrolled pod.
pub fn apply(netns: &NetNs) {
    apply_with(netns, DnsCapture::Off);
}

/// [`apply`] with DNS capture `dns`.
pub fn apply_with(netns: &NetNs, dns: DnsCapture) {
    let (v4, v6) = rules_with(dns);
    apply_golden(netns, &v4, Some(&v6));
    let pod = redirector::sys::netns::Netns::open(&netns.path()).expect("the pod's namespace");
    pod.run(redirector::sys::reply_route::install)
        .expect("entering the pod's namespace")
        .expect("the policy route");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_capture_sends_dns_to_15053_before_the_outbound_rule_of_each_family() {
        let (off_v4, off_v6) = rules();
        let (on_v4, on_v6) = rules_with(DnsCapture::On);
        for off in [&off_v4, &off_v6] {
            assert!(!off.contains("15053") && !off.contains("*raw"), "{off}");
        }
        for (on, loopback) in [(&on_v4, "127.0.0.1/32"), (&on_v6, "::1/128")] {
            let at = |text: &str| on.find(text).unwrap_or_else(|| panic!("{text}: {on}"));
            let tcp_dns = format!("! -d {loopback} -p tcp -m tcp --dport 53");
            assert!(at("! -o lo -p udp") < at("--to-ports 15001"), "{on}");
            assert!(at(&tcp_dns) < at("--to-ports 15001"), "{on}");
            assert!(at("*raw") > at("--to-ports 15006"), "{on}");
        }
    }
}
