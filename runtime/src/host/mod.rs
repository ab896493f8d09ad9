//! Code that runs on the host side, outside the sandbox's namespaces:
//!
//! - [`supervisor`]: the calling process (the CLI or the helper): prepare,
//!   clone init, write its id maps ([`userns`]), idmap the workspace
//!   ([`idmap`], retie invoked as root), release, watch, report; it
//!   starts init on another CPU than its own ([`placement`]); relays a
//!   command's terminal ([`terminal`]);
//! - [`net_stage`]: the lab modes' short-lived net stage, forked by the
//!   supervisor: wires the sandbox's network namespace to the lab over
//!   [`netlink`], then clones init;
//! - [`keeper`]: a lab's keeper process, which holds the lab's namespaces
//!   (public as `retie_runtime::lab`).
//!
//! What runs inside the sandbox is in `crate::init` (PID 1) and
//! `crate::command` (the command's own process).

pub mod idmap;
pub mod keeper;
pub mod net_stage;
pub mod netlink;
pub mod placement;
pub mod supervisor;
pub mod terminal;
pub mod userns;
