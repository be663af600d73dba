//! Redis Sentinel: a master found by name through its sentinels, again
//! after every failover.

use std::sync::{Arc, Mutex};

use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Client, IntoConnectionInfo, RedisResult};

use crate::mutex::lock;
use crate::session::{self, Server};

/// The master that sentinels know as `master_name`. Locks acquired with
/// [`crate::Lock::acquire_in`] on it go to the master the sentinels name at
/// the time: every new connection (the session's, the shared command
/// connection, the watchdog's) asks them first, so after a failover
/// (connection closed or refused, `READONLY`, `UNBLOCKED`) the session
/// reopens on the new master, sends its waits again and re-watches its
/// grants there.
#[derive(Clone)]
pub struct SentinelMaster {
    pub(crate) server: Arc<Server>,
}

impl SentinelMaster {
    /// `sentinels`' addresses; `node` how to connect to the master (user,
    /// password, database, TLS), the defaults if `None`. Asks the sentinels
    /// for the master now.
    pub fn new<T: IntoConnectionInfo>(
        sentinels: Vec<T>,
        master_name: &str,
        node: Option<SentinelNodeConnectionInfo>,
    ) -> RedisResult<SentinelMaster> {
        let sentinels =
            sentinels.into_iter().map(IntoConnectionInfo::into_connection_info).collect::<RedisResult<Vec<_>>>()?;
        let name = format!("sentinel {master_name} {:?}", sentinels.iter().map(|s| &s.addr).collect::<Vec<_>>());
        let mut finder = SentinelClient::build(sentinels, master_name.to_string(), node, SentinelServerType::Master)?;
        let client = finder.get_client()?;
        let finder = Mutex::new(finder);
        let resolve: session::Resolver = Arc::new(move || lock(&finder).get_client());
        Ok(SentinelMaster { server: session::server_named(name, client, Some(resolve), None) })
    }

    /// The client of the master as last found.
    pub fn client(&self) -> Client {
        self.server.client()
    }
}

impl std::fmt::Debug for SentinelMaster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelMaster").field("master", &self.client().get_connection_info().addr).finish()
    }
}
