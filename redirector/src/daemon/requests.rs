//! The API's requests answered on the node's pods ([`Pods`]): blocking work, run off the
//! async threads.

use std::collections::BTreeMap;

use redirector_common::{NetnsCookie, PodConfig, Reason, COUNTER_SLOTS};

use crate::api::{PodInfo, PodRef, Request, Response};
use crate::{
    engine::live_pod::LivePod,
    pods::{records::PodRecord, Added, Change, PodError, Pods},
    sys::{fs_error::FsError, netns::Netns},
};

/// Why the API refused a request: the answer's `error` is its message.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("name the pod with netns or name")]
    Unnamed,
    #[error("no such pod")]
    NoSuchPod,
    #[error("trace is answered as a stream")]
    TraceIsAStream,
    #[error(transparent)]
    Pod(#[from] PodError),
    #[error(transparent)]
    Records(#[from] FsError),
}

impl Pods {
    pub fn handle(&self, request: Request) -> Response {
        let result = match request {
            Request::Add {
                netns,
                name,
                dialect,
                args,
                annotations,
                cgroup,
                cni,
            } => {
                let flags = match crate::mesh::requested(dialect, &args, &annotations) {
                    Ok(Ok(flags)) => flags,
                    Ok(Err(why)) => {
                        return Response::done(format!("not captured: {why}"), Vec::new())
                    }
                    Err(err) => return Response::failed(RequestError::Pod(PodError::Flags(err))),
                };
                crate::mesh::pod_spec(&flags)
                    .map_err(PodError::from)
                    .and_then(|spec| self.add(&netns, name, (flags, &spec), cni, cgroup))
                    .map(|added| self.added(added))
                    .map_err(RequestError::from)
            }
            Request::Del(pod) => self.del(&pod),
            Request::List => self.list(),
            Request::Check(pod) => self.check(&pod),
            // A stream, not one answer: the connection runs it (`super::trace`).
            Request::Trace(_) => Err(RequestError::TraceIsAStream),
        };
        result.unwrap_or_else(Response::failed)
    }

    fn added(&self, added: Added) -> Response {
        let info = match (added.change, &added.config) {
            // Just written: the plan's config, and counters that start at zero.
            (Change::Captured, Some(config)) => {
                pod_info(&added.record, Some(config), &[0; COUNTER_SLOTS])
            }
            _ => self.info(&added.record),
        };
        Response::done(added.change.as_str(), vec![info])
    }

    /// The cookie of a pod named by request: its record's, else its namespace's.
    fn find(&self, pod: &PodRef) -> Result<(Option<PodRecord>, Option<NetnsCookie>), RequestError> {
        if pod.netns.is_none() && pod.name.is_none() {
            return Err(RequestError::Unnamed);
        }
        let record = self
            .records
            .find(pod.name.as_deref(), pod.netns.as_deref())?;
        let cookie = match (&record, &pod.netns) {
            (Some(record), _) => Some(record.cookie()),
            (None, Some(path)) => Netns::open(path).ok().map(|n| n.cookie()),
            (None, None) => None,
        };
        Ok((record, cookie))
    }

    /// What a `trace` request watches, and the names of the pods it may report.
    pub fn trace_target(
        &self,
        pod: &PodRef,
    ) -> Result<(crate::trace::Traced, BTreeMap<u64, String>), RequestError> {
        let names = self
            .records
            .all()?
            .into_iter()
            .filter_map(|r| Some((r.netns_cookie, r.name?)))
            .collect();
        if pod.netns.is_none() && pod.name.is_none() {
            return Ok((crate::trace::Traced::All, names));
        }
        match self.find(pod)? {
            (_, Some(cookie)) if LivePod::open(&self.root, cookie).is_ok() => {
                Ok((crate::trace::Traced::One(cookie), names))
            }
            _ => Err(RequestError::NoSuchPod),
        }
    }

    fn del(&self, pod: &PodRef) -> Result<Response, RequestError> {
        let (record, cookie) = self.find(pod)?;
        let removed = self.remove(record, cookie)?;
        Ok(Response::done(removed.as_str(), Vec::new()))
    }

    fn check(&self, pod: &PodRef) -> Result<Response, RequestError> {
        let (Some(record), _) = self.find(pod)? else {
            return Err(RequestError::NoSuchPod);
        };
        let spec = crate::mesh::pod_spec(&record.flags()).map_err(PodError::from)?;
        self.check_record(&record, &spec)?;
        Ok(Response::done(
            "captured as planned",
            vec![self.info(&record)],
        ))
    }

    fn list(&self) -> Result<Response, RequestError> {
        let records = self.records.all()?;
        let pods = records.iter().map(|r| self.info(r)).collect();
        Ok(Response::done(format!("{} pod(s)", records.len()), pods))
    }

    fn info(&self, record: &PodRecord) -> PodInfo {
        let mut info = match LivePod::open(&self.root, record.cookie()) {
            Ok(live) => pod_info(record, Some(&live.config), &live.counters()),
            Err(_) => pod_info(record, None, &[0; COUNTER_SLOTS]),
        };
        info.outside_node_cgroup = self.outside_of(record.netns_cookie);
        info
    }
}

/// What the API reports of a pod: its record, its installed config, its non-zero counters.
fn pod_info(
    record: &PodRecord,
    config: Option<&PodConfig>,
    counters: &[u64; COUNTER_SLOTS],
) -> PodInfo {
    PodInfo {
        name: record.name.clone(),
        netns: record.netns.clone(),
        netns_cookie: record.netns_cookie,
        args: record.args.clone(),
        config: config.map(|c| {
            format!(
                "-p {} -z {} -e {} flags {:#x}",
                c.outbound_port, c.inbound_port, c.tunnel_port, c.flags
            )
        }),
        counters: Reason::ALL
            .iter()
            .filter(|r| counters[**r as usize] != 0)
            .map(|r| (r.name().to_owned(), counters[*r as usize]))
            .collect(),
        outside_node_cgroup: None,
        cgroup: record.cgroup.clone(),
    }
}
