//! Who holds a lock: the owner a thread acquires as unless told another,
//! and the server's answer that an owner does not hold a lock (any more).

use std::sync::OnceLock;

/// `<random UUID of this process>:<thread id>` (made once per thread).
pub(crate) fn thread_owner() -> String {
    static PROCESS: OnceLock<String> = OnceLock::new();
    thread_local! {
        static OWNER: String = {
            let process = PROCESS.get_or_init(|| uuid::Uuid::new_v4().to_string());
            let thread = format!("{:?}", std::thread::current().id());
            let thread = thread.trim_start_matches("ThreadId(").trim_end_matches(')');
            format!("{process}:{thread}")
        };
    }
    OWNER.with(String::clone)
}

/// The error code `NOTOWNER`: the owner does not hold the lock (any more).
pub(crate) fn is_notowner(e: &redis::RedisError) -> bool {
    e.code() == Some("NOTOWNER")
}
