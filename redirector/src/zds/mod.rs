//! The node agent's side of ZDS, the protocol by which istio ambient's ztunnel learns the
//! pods it proxies: ztunnel connects to the agent's socket, says hello, and is sent every
//! enrolled pod with its network namespace, then each pod as it comes and goes, each
//! request answered by an ack.

pub mod agent;
pub mod seqpacket;
pub mod wire;
