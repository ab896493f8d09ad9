//! Integration tests: every test drives the real `retie` binary.
//!
//! Each test runs once per leg: as the invoking user and, when the
//! invoking user is root, again as uid 65534 (via setpriv, from a
//! world-readable copy of the binary, with a home it owns). A test that
//! cannot run a leg says so on stderr; none passes silently.

mod harness;
mod pty;

mod agent;
mod bigchange;
mod cli;
mod diffs;
mod escapes;
mod exec;
mod exec_tty;
mod firsthour;
mod helper;
mod identity;
mod install;
mod kernels;
mod lab;
mod ledger;
mod library;
mod lifecycle;
mod models;
mod net;
mod overlay;
mod pgledger;
mod policy;
mod providers;
mod resume;
mod retest;
mod small_helper;
mod toolchain;
mod tty;
