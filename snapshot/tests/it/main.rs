//! Integration tests for retie-snapshot: one binary, a shared harness.
//! They build real upper layers with an overlay mount inside
//! `unshare -Urm` and pass as root and as an unprivileged user.

mod boundary;
mod cases;
mod common;
mod crash;
mod moved;
mod packs;
mod plants;
mod race;
mod whole;
