//! The scenarios; schedule.rs runs them in order.

pub mod backlog;
pub mod contended;
pub mod expiry;
pub mod fenced;
pub mod philosophers;
pub mod ping;
pub mod scale;
pub mod shared;
pub mod uncontended;
pub mod vanished;
pub mod waiters;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    Ping,
    Uncontended,
    Contended,
    Expiry,
    Vanished,
    Backlog,
    RwLock,
    Semaphore,
    Scale,
    Waiters,
    Philosophers,
    Fenced,
}

impl Scenario {
    pub const ALL: [Scenario; 12] = [
        Scenario::Ping,
        Scenario::Uncontended,
        Scenario::Contended,
        Scenario::Expiry,
        Scenario::Vanished,
        Scenario::Backlog,
        Scenario::RwLock,
        Scenario::Semaphore,
        Scenario::Scale,
        Scenario::Waiters,
        Scenario::Philosophers,
        Scenario::Fenced,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Ping => "ping",
            Scenario::Uncontended => "uncontended",
            Scenario::Contended => "contended",
            Scenario::Expiry => "expiry",
            Scenario::Vanished => "vanished",
            Scenario::Backlog => "backlog",
            Scenario::RwLock => "rwlock",
            Scenario::Semaphore => "semaphore",
            Scenario::Scale => "scale",
            Scenario::Waiters => "waiters",
            Scenario::Philosophers => "philosophers",
            Scenario::Fenced => "fenced",
        }
    }

    pub fn parse(name: &str) -> Result<Scenario, String> {
        Scenario::ALL.into_iter().find(|s| s.name() == name).ok_or_else(|| format!("unknown scenario {name:?}"))
    }
}

/// The name under which `contended` with this hold time is reported.
pub fn contended_label(hold_us: u64) -> String {
    format!("contended hold={hold_us}us")
}
