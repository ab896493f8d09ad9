//! # retie-runtime: the sandbox
//!
//! Runs one command with nothing but its workspace in reach: new user,
//! mount, pid, ipc, uts, net and cgroup namespaces; a tmpfs root with a
//! read-only system view from a [`Profile`]; no capabilities; Landlock;
//! seccomp; a clean environment. No root and no daemon are needed.
//!
//! The principal type is [`SandboxSpec`], built by [`Sandbox::builder`] and
//! run by [`run`] (from a single-threaded process, such as the `retie` CLI)
//! or [`helper::run_via_helper`] (from anywhere, via a helper process).
//!
//! The set-up itself lives in the private modules `init` (the recipe, step
//! by step), `setup` (one module per step) and `sys` (the few raw system
//! calls no crate wraps); the public surface is the builder, the spec,
//! [`run`], the [`helper`], the [`preflight`], the [`lab`] keeper, the
//! [`deny_table`] and the [`toolchain`] detection. This crate knows
//! nothing of agents, ledgers or policies.

#![warn(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

pub mod error;
pub mod helper;
mod init;
pub mod lab;
pub mod outcome;
pub mod preflight;
pub mod profile;
mod protocol;
mod setup;
pub mod spec;
mod supervisor;
mod sys;
pub mod toolchain;

pub use error::{Result, RuntimeError};
pub use outcome::{
    Outcome, EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, EXIT_SANDBOX_FAILED, EXIT_TIMEOUT,
};
pub use profile::Profile;
/// The lab's stable address (`lab` inside lab-mode sandboxes).
pub use setup::net_lab::LAB_ADDRESS;
/// The seccomp deny table in force per network mode, for probes that must
/// try every rule (`retie selftest`).
pub use setup::seccomp::{deny_table, ArgCheck, ArgOp, DeniedCall, DENY_ERRNO};
pub use spec::{
    Hide, HideKind, Identity, Interrupt, LabNet, NetMode, RoBind, Sandbox, SandboxBuilder,
    SandboxSpec, SpecWire, Stdio, WorkspaceMode,
};
pub use supervisor::{run, start, Started};
