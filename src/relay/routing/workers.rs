//! The background work of cluster routing, handed to the server's task owner: the bus's
//! writer, the listener that applies what other nodes say ([`super::peers`]) and the
//! node's heartbeat ([`super::lifecycle`]). None on one node.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::lifecycle::{LoginCheck, Node};
use super::peers::Peers;
use super::Router;
use crate::relay::{Presence, Sessions};
use crate::shutdown::StopSignal;

/// A worker's work, started with the signal that stops it.
pub type Work = Box<dyn FnOnce(StopSignal) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// A background task of the routing, for the server's task owner to run.
pub struct Worker {
    pub name: &'static str,
    pub run: Work,
}

/// The workers of this node's routing.
pub fn workers(
    presence: &Presence,
    sessions: &Sessions,
    logins: Arc<dyn LoginCheck>,
) -> Vec<Worker> {
    let Router::Cluster(c) = &sessions.hub().router else {
        return Vec::new();
    };
    let writer = c.cluster().clone();
    let listener = c.cluster().clone();
    let peers = Arc::new(Peers::new(presence, sessions, c.cluster().clone()));
    let beating = Node::new(presence, sessions, logins);
    vec![
        Worker {
            name: "cluster-writer",
            run: Box::new(move |stop| Box::pin(writer.run_writer(stop))),
        },
        Worker {
            name: "cluster-listen",
            run: Box::new(move |stop| {
                Box::pin(crate::cluster::inbound::listen(listener, peers, stop))
            }),
        },
        Worker {
            name: "cluster-heartbeat",
            run: Box::new(move |stop| Box::pin(beating.heartbeat(stop))),
        },
    ]
}
