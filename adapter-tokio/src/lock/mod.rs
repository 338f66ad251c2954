//! `dagnats-leases lock KEY -- CMD [ARGS...]`: runs a command while this process
//! holds a lease, campaigning with the holder library
//! ([`Member`](crate::member::Member), [`Elector`](crate::member::Elector)).
//!
//! Two processes take part, so that the command is stopped in time even when the
//! tool itself cannot act (frozen by SIGSTOP, a long pause, killed):
//!
//! - the **tool** holds the lease: it campaigns, renews (the library does), and
//!   tells the watchdog every new deadline as an absolute `CLOCK_BOOTTIME` time (one
//!   clock for every process on the machine, counting time suspended);
//! - the **watchdog** (`dagnats-leases __lock-watchdog`, started by the tool in a process
//!   group of its own) runs the command in another process group and keeps the
//!   deadline: `--grace` before it the command's group gets SIGTERM, SIGKILL at the
//!   latest at the deadline, which comes before the server can expire the lease.
//!
//! Every rule (when to signal, when the command is over, when to release; which
//! key and fence are held, which renewals count, which holder a message names;
//! when the watchdog's timer is armed) is a core machine:
//! [`dagnats_leases_core::holder::supervise`], the watchdog's
//! [`Supervisor`](dagnats_leases_core::holder::supervise::Supervisor) and the tool's
//! [`Lock`](dagnats_leases_core::holder::supervise::Lock). This module is their IO:
//! processes, signals, the channel between the two processes (a socket pair that is
//! the watchdog's stdin), and one timer each.
//!
//! Both processes are child subreapers (`PR_SET_CHILD_SUBREAPER`): a process the
//! command leaves behind stays the watchdog's descendant (or the tool's, if the watchdog
//! dies), so "every process of the command is gone" can be known by reaping, and
//! the lease is released only then. SIGTERM, SIGINT and SIGHUP to either process are
//! passed on to the command. The command's stdin is `/dev/null`; stdout and stderr
//! are the tool's.
//!
//! What `lock` cannot cover: every process of the tool and the watchdog killed at once
//! (`kill -9` of both), or the whole host paused; the lease then runs out by its TTL
//! while the command may run on. Fence downstream writes with `DAGNATS_LEASE_FENCE`.
//!
//! Files: this one only names the parts and re-exports them; `args.rs` holds the
//! options and the command's environment, `say.rs` what `lock` says and its exit
//! codes, `tool.rs` the tool's loop over the holder library, `watchdog.rs` the
//! watchdog's loop, `channel.rs` the watchdog process and the channel to it,
//! `process.rs` the signals, the boot-time timer and the reaping.

mod args;
mod channel;
mod process;
mod say;
mod tool;
mod watchdog;

pub use args::{ENV_FENCE, ENV_HOLDER, ENV_KEY, LockArgs, WatchdogArgs};
pub use tool::run;
pub use watchdog::watchdog;

pub use crate::cli::parse_duration;
pub use crate::exit::{EXIT_BAD_GRACE, EXIT_CANNOT_RUN, EXIT_LEASE_LOST};
/// The longest default grace period (the default is a third of the TTL, at most this).
pub use dagnats_leases_core::holder::supervise::DEFAULT_GRACE_MAX;
