//! The daemon's API under abuse: callers that are not root, paths that are not network
//! namespaces, oversized and endless requests, clients that say nothing, bursts of
//! requests. The daemon keeps serving everyone else, stays within bounded memory, and
//! never applies a request it did not fully parse.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;

use redirector_tests::daemon::ask;
use redirector_tests::prelude::*;

/// A daemon and the node it lives in; keep both until the end of the test.
fn start(hint: &str) -> (Daemon, TestNode) {
    let node = TestNode::new(hint);
    (node.daemon(), node)
}

/// The daemon answers `list` on a fresh connection. One that a client blocks never answers,
/// which the connection's 30 s read timeout fails; how fast it answers is no claim here.
#[track_caller]
fn assert_serving(daemon: &Daemon) {
    let answer = ask(&mut daemon.connect(), r#"{"op":"list"}"#);
    assert_eq!(answer["ok"], true, "{answer}");
}

#[test]
fn callers_that_are_not_root_are_refused() {
    privileged!();
    let (daemon, _node) = start("abuseuid");
    let list = format!("pod --socket {} list", daemon.socket().display());
    let as_app = || redirector(&list).user(APP_UID, APP_UID).output();
    // The socket is root's, mode 0600.
    let out = as_app();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ermission denied"), "{err}");
    // Made reachable by mistake, the daemon still refuses by the caller's credentials.
    std::fs::set_permissions(daemon.socket(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = as_app();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_contains(
        &err,
        format!("only root may use this socket (caller uid {APP_UID})"),
    );
    assert_serving(&daemon);
}

#[test]
fn bad_requests_change_nothing_and_name_what_is_wrong() {
    privileged!();
    let (daemon, _node) = start("abusebad");
    let mut s = daemon.connect();
    // Each line: what the answer's error names, then the request.
    let table = r#"
        /etc/hostname   | {"op":"add","netns":"/etc/hostname","name":"x/y"}
        /nonexistent/ns | {"op":"add","netns":"/nonexistent/ns","name":"x/y"}
        70000           | {"op":"add","netns":"/proc/self/ns/net","args":["-p","70000"]}
        bad request     | {"op":"add","netns":"/proc/self/ns/net","args":["-p","15001"
        bad request     | {"op":"explode"}"#;
    let rows = table.lines().filter_map(|l| l.split_once(" | "));
    let rows = rows.map(|(expected, request)| (request.trim(), expected.trim()));
    for (request, expected) in rows.chain([("\u{0}\u{1}garbage", "bad request")]) {
        let answer = ask(&mut s, request);
        assert_eq!(answer["ok"], false, "{request}: {answer}");
        let error = answer["error"].as_str().unwrap();
        assert!(error.contains(expected), "{request}: {error}");
    }
    let list = ask(&mut s, r#"{"op":"list"}"#);
    assert!(
        list["pods"].as_array().is_none_or(|p| p.is_empty()),
        "{list}"
    );
    assert!(daemon.pod_names().is_empty());
}

#[test]
fn oversized_endless_and_silent_clients_do_not_stop_the_others() {
    privileged!();
    let (daemon, _node) = start("abusebig");
    let rss_before = daemon.rss_kib();
    // Silent: connects and sends nothing, for the whole test.
    let _silent: Vec<UnixStream> = (0..20).map(|_| daemon.connect()).collect();
    assert_serving(&daemon);

    // Oversized: refused with a reason, then closed.
    let mut big = daemon.connect();
    let request = format!(r#"{{"op":"list","pad":"{}"}}"#, "x".repeat(100 * 1024));
    let _ = big.write_all(request.as_bytes());
    let mut answer = String::new();
    let _ = BufReader::new(&big).read_line(&mut answer);
    assert_contains(&answer, "request longer than 65536 bytes");

    // Endless: 32 MiB with no newline; the daemon closes it long before.
    let mut endless = daemon.connect();
    let chunk = vec![b'a'; 64 * 1024];
    let mut sent = 0usize;
    while sent < 32 << 20 {
        match endless.write(&chunk) {
            Ok(n) => sent += n,
            Err(_) => break,
        }
    }
    assert!(sent < 32 << 20, "the daemon read 32 MiB of one request");
    let mut rest = Vec::new();
    let _ = endless.read_to_end(&mut rest);

    assert_serving(&daemon);
    let grown = daemon.rss_kib().saturating_sub(rss_before);
    assert!(grown < 16 * 1024, "the daemon grew by {grown} KiB");
}

#[test]
fn a_burst_of_requests_is_served_in_bounded_memory() {
    privileged!();
    let (daemon, _node) = start("abuseburst");
    let rss_before = daemon.rss_kib();
    // 2,000 requests pipelined on one connection, then every answer.
    let mut s = daemon.connect();
    let burst: String = (0..2000).map(|_| "{\"op\":\"list\"}\n").collect();
    s.write_all(burst.as_bytes()).unwrap();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    for i in 0..2000 {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert!(line.contains("\"ok\":true"), "answer {i}: {line}");
    }
    // 50 clients at once, 20 requests each.
    let clients: Vec<_> = (0..50)
        .map(|_| {
            let socket = daemon.socket().to_path_buf();
            std::thread::spawn(move || {
                let mut s = UnixStream::connect(socket).unwrap();
                s.set_read_timeout(Some(EVENTUALLY)).unwrap();
                (0..20).all(|_| ask(&mut s, r#"{"op":"list"}"#)["ok"] == true)
            })
        })
        .collect();
    for c in clients {
        assert!(c.join().unwrap());
    }
    assert_serving(&daemon);
    let grown = daemon.rss_kib().saturating_sub(rss_before);
    assert!(grown < 16 * 1024, "the daemon grew by {grown} KiB");
}
