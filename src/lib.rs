pub mod args;
pub mod lock;
pub mod queue;
