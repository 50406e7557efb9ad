//! A pod removed without `--cleanup-only` leaves detached links and map entries behind;
//! `redirector gc` removes them, and leaves live pods alone.

use redirector_tests::prelude::*;
use redirector_tests::redirector::status;

fn gc(root: &PinRoot) -> String {
    let out = redirector(&format!("gc --pin-root {}", root.path().display())).output();
    assert_success(&out);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn gc_removes_pods_that_are_gone_and_keeps_live_ones() {
    privileged!();
    let root = PinRoot::new("gc");
    let live = Topology::new("gclive");
    install(&live.pod, &live.pod_cgroup, &root, &STANDARD_INJECTION);
    let gone = Topology::new("gcgone");
    install(&gone.pod, &gone.pod_cgroup, &root, &STANDARD_INJECTION);
    let gone_cookie = gone.pod.cookie();
    let gone_links: Vec<u64> = pins_under(root.path())
        .iter()
        .filter(|p| {
            p.to_string_lossy()
                .contains(&format!("/links/{gone_cookie}_"))
        })
        .map(|p| pinned_id("link", p))
        .collect();
    assert_eq!(gone_links.len(), 7);
    assert_eq!(
        gc(&root).trim(),
        "removed 0 stale pod(s)",
        "nothing is stale while both pods exist"
    );

    // The pod goes away (cgroup and netns removed), as when a pod is deleted. The kernel
    // detaches its links a moment after the cgroup is released.
    drop(gone);
    let mut said = String::new();
    within(EVENTUALLY, || {
        said = gc(&root);
        said.contains("removed 1")
    });
    assert_contains(&said, format!("netns cookies [{gone_cookie}]"));
    assert_eq!(pod_links(&root, gone_cookie), None, "{:#}", status(&root));
    assert!(wait_gone("link", &gone_links, EVENTUALLY).is_empty());
    // The live pod keeps its links and its object.
    let live_links = pod_links(&root, live.pod.cookie()).expect("the live pod");
    assert_eq!(live_links.len(), 7, "{live_links:?}");
    assert!(!loaded_ids("prog").is_empty());
}
