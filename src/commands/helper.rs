//! `retie __sandbox-helper`: the single-threaded helper a multi-threaded
//! program (the agent) spawns to run one sandbox. See
//! `retie_runtime::helper`.

use clap::Args;

#[derive(Args)]
pub struct HelperArgs {
    /// fd carrying the JSON request (closed after reading).
    #[arg(long)]
    pub request_fd: i32,
    /// fd for the JSON reply.
    #[arg(long)]
    pub reply_fd: i32,
}

pub fn run(args: HelperArgs) -> i32 {
    retie_runtime::helper::serve(args.request_fd, args.reply_fd)
}
