//! The engine both ways of running redirector share. A pod is set up in four steps, each
//! its own module: [`facts`] reads the pod, [`plan`] turns a [`spec::CaptureConfig`] and
//! the facts into the exact kernel state (pure data), [`observe`] reads what is installed
//! in the plan's shape and [`diff`] compares the two; [`apply`] executes the difference
//! with undo. [`gc`] removes pods that are gone, [`node`] holds the node-level links and
//! upgrades, and the rest are what the steps use.

pub mod apply;
pub mod capture;
pub mod diff;
pub mod error;
pub mod facts;
pub mod gc;
pub mod listeners;
pub mod live_pod;
pub mod loopback;
pub mod neighbours;
pub mod node;
pub mod observe;
pub mod plan;
pub mod pod_cgroup;
pub mod pod_keys;
pub mod remove;
pub mod setup;
pub mod spec;
pub mod ztunnel_cgroup;
