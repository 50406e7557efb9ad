//! istio-cni's in-pod rules for an ambient pod, the reference the ambient suite compares
//! redirector with: iptables (restore) rules written from istio-cni's rule set (DNS
//! capture off), and its policy route, which is `redirector::sys::reply_route`'s.
//!
//! ztunnel's sockets carry mark 0x539 (1337). In `mangle`, a connection that comes from
//! one is connmarked 0x111, and packets of a connmarked connection take the mark back on
//! their way out: the app's replies to ztunnel's spoofed-source upstreams are routed by
//! the mark to the table that delivers locally. In `nat`, inbound TCP not to loopback, not
//! to HBONE (15008) and not from ztunnel goes to 15006; outbound TCP not to loopback, not
//! over `lo` and not from ztunnel goes to 15001; kubelet's probes (SNATed on the host to a
//! link-local address) pass.

use crate::{iptables::apply_golden, NetNs};

/// The rules, for IPv4; IPv6 takes the same with its own loopback and probe address.
const RULES_V4: &str = "\
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

/// The rules for IPv4 and for IPv6.
pub fn rules() -> (String, String) {
    let v4 = RULES_V4
        .replace("PROBE", PROBE_V4)
        .replace("LOOPBACK", "127.0.0.1/32");
    let v6 = RULES_V4
        .replace("PROBE", PROBE_V6)
        .replace("LOOPBACK", "::1/128");
    (v4, v6)
}

/// Applies the rules and the policy route inside `netns`, as istio-cni's node agent does
/// for an enrolled pod.
pub fn apply(netns: &NetNs) {
    let (v4, v6) = rules();
    apply_golden(netns, &v4, Some(&v6));
    let pod = redirector::sys::netns::Netns::open(&netns.path()).expect("the pod's namespace");
    pod.run(redirector::sys::reply_route::install)
        .expect("entering the pod's namespace")
        .expect("the policy route");
}
