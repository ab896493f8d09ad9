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
//! The private modules are named for the process that runs their code:
//! `host` (the supervisor, the lab net stage, the lab keeper), `init` (the
//! sandbox's PID 1: the recipe, then one module per set-up step) and
//! `command` (the command's own process, up to its exec); `protocol` holds
//! the messages between them and `sys` the few raw system calls no crate
//! wraps. The public surface is the builder, the spec,
//! [`run`], the [`helper`], the [`preflight`], the [`lab`] keeper, the
//! [`deny_table`] and the [`toolchain`] detection. This crate knows
//! nothing of agents, ledgers or policies.

#![warn(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod command;
pub mod error;
pub mod helper;
mod host;
mod init;
pub mod outcome;
pub mod preflight;
pub mod profile;
mod protocol;
pub mod spec;
mod sys;
pub mod toolchain;

pub use error::{Result, RuntimeError};
/// The lab's stable address (`lab` inside lab-mode sandboxes).
pub use host::net_stage::LAB_ADDRESS;
pub use host::supervisor::{earlier_runs, run, start, Started};
/// The seccomp deny table in force per network mode, for probes that must
/// try every rule (`retie selftest`).
pub use init::seccomp::{deny_table, ArgCheck, ArgOp, DeniedCall, DENY_ERRNO};
pub use outcome::{
    Outcome, EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, EXIT_SANDBOX_FAILED, EXIT_TIMEOUT,
};
pub use profile::Profile;
pub use spec::{
    Hide, HideKind, Identity, Interrupt, LabNet, NetMode, ProxyNet, RoBind, Sandbox,
    SandboxBuilder, SandboxSpec, SpecWire, Stdio, WorkspaceMode,
};

/// A lab's network namespace and the keeper process that holds it.
pub use host::keeper as lab;
